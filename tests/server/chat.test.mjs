// POST /v1/chat/completions through the official openai client: the demo model's chat template,
// logprobs in the chat format, n and seeds.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { client, MODEL, post, rawStream } from './lib.mjs';

const openai = client();
const MESSAGES = [
  { role: 'system', content: 'You are a terse assistant.' },
  { role: 'user', content: 'Tell me about the river.' },
];
// The demo model's template (tokenizer_config.json), written out by hand.
const RENDERED = '<|startoftext|><|bom|><|system|> You are a terse assistant.<|eom|>' +
  '<|bom|><|user|> Tell me about the river.<|eom|><|bom|><|assistant|>';

test('messages are rendered with the model template: same output as the rendered prompt', async () => {
  const chat = await openai.chat.completions.create({
    model: MODEL, messages: MESSAGES, max_tokens: 12, temperature: 0, ignore_eos: true,
  });
  assert.equal(chat.object, 'chat.completion');
  assert.match(chat.id, /^chatcmpl-/);
  assert.equal(chat.choices.length, 1);
  const [choice] = chat.choices;
  assert.equal(choice.message.role, 'assistant');
  assert.equal(typeof choice.message.content, 'string');
  assert.equal(choice.finish_reason, 'length');
  assert.equal(choice.logprobs, null);

  const { json: tokenized } = await post('/tokenize', { messages: MESSAGES });
  const { json: rendered } = await post('/tokenize', { prompt: RENDERED, add_special_tokens: false });
  assert.deepEqual(tokenized.tokens, rendered.tokens);
  assert.deepEqual(chat.usage, { prompt_tokens: rendered.count, completion_tokens: 12, total_tokens: rendered.count + 12 });
  const completion = await openai.completions.create({
    model: MODEL, prompt: rendered.tokens, max_tokens: 12, temperature: 0, ignore_eos: true,
  });
  assert.equal(choice.message.content, completion.choices[0].text);
});

test('content given as text parts equals content given as a string', async () => {
  const parts = [{ role: 'user', content: [{ type: 'text', text: 'Tell me ' }, { type: 'text', text: 'about the river.' }] }];
  const a = await openai.chat.completions.create({ model: MODEL, messages: parts, max_tokens: 8, temperature: 0 });
  const b = await openai.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'Tell me about the river.' }], max_tokens: 8, temperature: 0,
  });
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  assert.equal(a.usage.prompt_tokens, b.usage.prompt_tokens);
});

test('return_token_ids (vLLM form): the rendered prompt ids at the top, each choice its generated ids', async () => {
  const body = { model: MODEL, messages: MESSAGES, max_completion_tokens: 6, temperature: 0, return_token_ids: true };
  const { json: completion } = await post('/v1/chat/completions', body);
  const { json: tokens } = await post('/tokenize', { messages: MESSAGES });
  assert.deepEqual(completion.prompt_token_ids, tokens.tokens);
  const [choice] = completion.choices;
  assert.equal(choice.token_ids.length, completion.usage.completion_tokens);
  const { events, done } = await rawStream('/v1/chat/completions', body);
  assert.ok(done);
  const chunks = events.slice(0, -1).map((event) => JSON.parse(event));
  assert.deepEqual(chunks[0].prompt_token_ids, tokens.tokens);
  assert.deepEqual(chunks.flatMap((chunk) => chunk.choices.flatMap((c) => c.token_ids)), choice.token_ids);
});

test('logprobs and top_logprobs in the chat format', async () => {
  const chat = await openai.chat.completions.create({
    model: MODEL, messages: MESSAGES, max_tokens: 8, temperature: 0, ignore_eos: true, logprobs: true, top_logprobs: 3,
  });
  const { content } = chat.choices[0].logprobs;
  assert.equal(content.length, 8);
  assert.equal(content.map((entry) => entry.token).join(''), chat.choices[0].message.content);
  for (const entry of content) {
    assert.deepEqual(Object.keys(entry).sort(), ['bytes', 'logprob', 'token', 'top_logprobs']);
    assert.deepEqual(entry.bytes, [...Buffer.from(entry.token, 'utf8')]);
    assert.ok(entry.logprob <= 0);
    assert.equal(entry.top_logprobs.length, 3);
    const logprobs = entry.top_logprobs.map((top) => top.logprob);
    assert.deepEqual(logprobs, [...logprobs].sort((x, y) => y - x), 'top_logprobs are not most likely first');
    assert.equal(entry.top_logprobs[0].token, entry.token);  // greedy
    assert.equal(entry.top_logprobs[0].logprob, entry.logprob);
    for (const top of entry.top_logprobs) assert.deepEqual(top.bytes, [...Buffer.from(top.token, 'utf8')]);
  }
  const noTop = await openai.chat.completions.create({
    model: MODEL, messages: MESSAGES, max_tokens: 4, temperature: 0, logprobs: true,
  });
  assert.equal(noTop.choices[0].logprobs.content.length, 4);
  assert.deepEqual(noTop.choices[0].logprobs.content.map((entry) => entry.top_logprobs), [[], [], [], []]);
  assert.deepEqual(noTop.choices[0].logprobs.content.map((entry) => entry.logprob),
    content.slice(0, 4).map((entry) => entry.logprob));
});

test('max_completion_tokens, n and seed', async () => {
  const body = { model: MODEL, messages: MESSAGES, max_completion_tokens: 10, ignore_eos: true, temperature: 1, n: 3, seed: 7 };
  const a = await openai.chat.completions.create(body);
  const b = await openai.chat.completions.create(body);
  assert.equal(a.choices.length, 3);
  assert.equal(a.usage.completion_tokens, 30);
  assert.deepEqual(a.choices.map((c) => c.message.content), b.choices.map((c) => c.message.content));
});

test('a conversation with an assistant turn renders each turn', async () => {
  const messages = [...MESSAGES, { role: 'assistant', content: 'It flows.' }, { role: 'user', content: 'Where?' }];
  const { json } = await post('/tokenize', { messages });
  const { json: rendered } = await post('/tokenize', {
    prompt: `${RENDERED} It flows.<|eom|><|bom|><|user|> Where?<|eom|><|bom|><|assistant|>`,
    add_special_tokens: false,
  });
  assert.deepEqual(json.tokens, rendered.tokens);
  const chat = await openai.chat.completions.create({ model: MODEL, messages, max_tokens: 4, temperature: 0 });
  assert.equal(chat.usage.prompt_tokens, rendered.count);
});
