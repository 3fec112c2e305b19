// POST /v1/completions through the official openai client: prompt forms, n, echo, logprobs, stop,
// max_tokens, seeds and usage.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { BASE, client, MODEL, post, rawStream } from './lib.mjs';

const openai = client();
const PROMPT = 'The meaning of life is';

async function greedy(body) {
  return openai.completions.create({ model: MODEL, temperature: 0, ...body });
}

test('a string prompt: one choice, text, finish_reason and usage', async () => {
  const completion = await greedy({ prompt: PROMPT, max_tokens: 12, ignore_eos: true });
  assert.equal(completion.object, 'text_completion');
  assert.equal(completion.model, MODEL);
  assert.match(completion.id, /^cmpl-/);
  assert.equal(completion.choices.length, 1);
  const [choice] = completion.choices;
  assert.equal(choice.index, 0);
  assert.equal(typeof choice.text, 'string');
  assert.ok(choice.text.length > 0);
  assert.equal(choice.finish_reason, 'length');
  assert.equal(choice.logprobs, null);
  const tokens = await post('/tokenize', { prompt: PROMPT });
  assert.deepEqual(completion.usage, {
    prompt_tokens: tokens.json.count,
    completion_tokens: 12,
    total_tokens: tokens.json.count + 12,
  });
});

test('max_tokens bounds the completion; greedy is deterministic', async () => {
  const long = await greedy({ prompt: PROMPT, max_tokens: 20, ignore_eos: true, logprobs: 0 });
  const short = await greedy({ prompt: PROMPT, max_tokens: 7, ignore_eos: true, logprobs: 0 });
  assert.equal(short.usage.completion_tokens, 7);
  assert.equal(short.choices[0].logprobs.tokens.length, 7);
  assert.equal(long.usage.completion_tokens, 20);
  assert.deepEqual(short.choices[0].logprobs.tokens, long.choices[0].logprobs.tokens.slice(0, 7));
  assert.deepEqual(short.choices[0].logprobs.token_logprobs, long.choices[0].logprobs.token_logprobs.slice(0, 7));
  assert.ok(long.choices[0].text.startsWith(short.choices[0].text));
  const again = await greedy({ prompt: PROMPT, max_tokens: 20, ignore_eos: true, logprobs: 0 });
  assert.deepEqual(again.choices, long.choices);
  const zero = await greedy({ prompt: PROMPT, max_tokens: 0 });
  assert.equal(zero.usage.completion_tokens, 0);
  assert.equal(zero.choices[0].text, '');
});

test('a list of prompts: one choice per prompt, each equal to that prompt alone', async () => {
  const list = ['Once upon a time', 'The quick brown fox', 'In the beginning'];
  const together = await greedy({ prompt: list, max_tokens: 10, ignore_eos: true, logprobs: 1 });
  assert.equal(together.choices.length, 3);
  for (const [i, prompt] of list.entries()) {
    const alone = await greedy({ prompt, max_tokens: 10, ignore_eos: true, logprobs: 1 });
    assert.equal(together.choices[i].index, i);
    assert.equal(together.choices[i].text, alone.choices[0].text);
    assert.deepEqual(together.choices[i].logprobs, alone.choices[0].logprobs);
  }
  assert.equal(together.usage.completion_tokens, 30);
});

test('a token-id prompt equals its text, and a list of token-id prompts works', async () => {
  const { json } = await post('/tokenize', { prompt: PROMPT });
  const byText = await greedy({ prompt: PROMPT, max_tokens: 10, logprobs: 2 });
  const byIds = await greedy({ prompt: json.tokens, max_tokens: 10, logprobs: 2 });
  assert.equal(byIds.choices[0].text, byText.choices[0].text);
  assert.deepEqual(byIds.choices[0].logprobs, byText.choices[0].logprobs);
  assert.equal(byIds.usage.prompt_tokens, json.tokens.length);
  const lists = await greedy({ prompt: [json.tokens, json.tokens.slice(0, 2)], max_tokens: 4 });
  assert.equal(lists.choices.length, 2);
  assert.equal(lists.choices[0].text, (await greedy({ prompt: json.tokens, max_tokens: 4 })).choices[0].text);
});

test('n > 1: n choices; seeded sampling is reproducible and seeds differ', async () => {
  const body = { model: MODEL, prompt: PROMPT, max_tokens: 16, ignore_eos: true, temperature: 1, n: 4, seed: 1234 };
  const first = await openai.completions.create(body);
  const second = await openai.completions.create(body);
  assert.equal(first.choices.length, 4);
  assert.deepEqual(first.choices.map((c) => c.index), [0, 1, 2, 3]);
  assert.deepEqual(second.choices.map((c) => c.text), first.choices.map((c) => c.text));
  assert.equal(first.usage.completion_tokens, 64);
  assert.ok(new Set(first.choices.map((c) => c.text)).size > 1, 'four samples at temperature 1 all equal');
  const other = await openai.completions.create({ ...body, seed: 99 });
  assert.notDeepEqual(other.choices.map((c) => c.text), first.choices.map((c) => c.text));
  // n with greedy: every choice is the greedy continuation.
  const greedyN = await greedy({ prompt: PROMPT, max_tokens: 8, n: 3 });
  assert.equal(new Set(greedyN.choices.map((c) => c.text)).size, 1);
});

test('logprobs: OpenAI completions format (tokens, token_logprobs, top_logprobs, text_offset)', async () => {
  const completion = await greedy({ prompt: PROMPT, max_tokens: 10, ignore_eos: true, logprobs: 3 });
  const { text, logprobs } = completion.choices[0];
  assert.deepEqual(Object.keys(logprobs).sort(), ['text_offset', 'token_logprobs', 'tokens', 'top_logprobs']);
  assert.equal(logprobs.tokens.length, 10);
  assert.equal(logprobs.tokens.join(''), text);
  let offset = 0;
  for (let i = 0; i < 10; i += 1) {
    assert.equal(logprobs.text_offset[i], offset);
    offset += logprobs.tokens[i].length;
    const lp = logprobs.token_logprobs[i];
    assert.ok(Number.isFinite(lp) && lp <= 0, `token_logprobs[${i}] = ${lp}`);
    const top = Object.entries(logprobs.top_logprobs[i]);
    assert.ok(top.length === 3 || top.length === 4, `top_logprobs[${i}] has ${top.length} entries`);
    // Greedy: the chosen token is the most likely one.
    const best = Math.max(...top.map(([, value]) => value));
    assert.equal(lp, best);
    assert.equal(logprobs.top_logprobs[i][logprobs.tokens[i]], lp);
  }
  const none = await greedy({ prompt: PROMPT, max_tokens: 3, logprobs: 0 });
  assert.deepEqual(none.choices[0].logprobs.top_logprobs.map((top) => Object.keys(top).length <= 1), [true, true, true]);
});

test('echo: the prompt leads the text; with logprobs, the prompt tokens lead with a null first logprob', async () => {
  const plain = await greedy({ prompt: PROMPT, max_tokens: 6, ignore_eos: true, logprobs: 1 });
  const echoed = await greedy({ prompt: PROMPT, max_tokens: 6, ignore_eos: true, logprobs: 1, echo: true });
  assert.equal(echoed.choices[0].text, PROMPT + plain.choices[0].text);
  const { logprobs } = echoed.choices[0];
  const numPrompt = echoed.usage.prompt_tokens;
  assert.equal(logprobs.tokens.length, numPrompt + 6);
  assert.equal(logprobs.token_logprobs[0], null);
  assert.equal(logprobs.top_logprobs[0], null);
  for (let i = 1; i < logprobs.token_logprobs.length; i += 1) assert.ok(logprobs.token_logprobs[i] <= 0);
  assert.deepEqual(logprobs.token_logprobs.slice(numPrompt), plain.choices[0].logprobs.token_logprobs);
  const echoOnly = await greedy({ prompt: PROMPT, max_tokens: 0, echo: true });
  assert.equal(echoOnly.choices[0].text, PROMPT);
});

// OpenAI: text_offset[i] is where tokens[i] starts in the returned text. A special token (BOS with echo,
// EOS at the end) or a byte that does not end a character ('bytes:\xc3') is named in tokens but takes no
// width; the token that completes a character carries it.
test('echo + logprobs: text_offset indexes the returned text', async () => {
  for (const [prompt, maxTokens] of [[PROMPT, 4], ['Café crème is', 4], [PROMPT, 200]]) {
    const completion = await greedy({ prompt, max_tokens: maxTokens, logprobs: 0, echo: true });
    const { text, logprobs } = completion.choices[0];
    let rebuilt = '';
    for (let i = 0; i < logprobs.tokens.length; i += 1) {
      const token = logprobs.tokens[i];
      const width = (logprobs.text_offset[i + 1] ?? text.length) - logprobs.text_offset[i];
      assert.equal(logprobs.text_offset[i], rebuilt.length, `text_offset[${i}] of '${token}' in '${text}'`);
      if (width === 0 && (/^<\|[a-z]+\|>$/.test(token) || token.startsWith('bytes:'))) continue;  // no text of their own
      assert.ok(text.startsWith(token, logprobs.text_offset[i]),
        `tokens[${i}] '${token}' is not at text_offset ${logprobs.text_offset[i]} of '${text}'`);
      rebuilt += token;
    }
    assert.equal(rebuilt, text);
  }
});

// OpenAI counts characters, not UTF-8 bytes (jambo counted bytes before a81d279).
test('text_offset counts characters, not UTF-8 bytes', async () => {
  const prompt = 'Café au lait is';
  const completion = await greedy({ prompt, max_tokens: 6, ignore_eos: true, logprobs: 0 });
  const { text, logprobs } = completion.choices[0];
  assert.equal(text, logprobs.tokens.join(''));
  const echoed = await greedy({ prompt: 'the café is', max_tokens: 6, ignore_eos: true, logprobs: 0 });
  const generated = echoed.choices[0].logprobs;
  let offset = 0;
  for (let i = 0; i < generated.tokens.length; i += 1) {
    assert.equal(generated.text_offset[i], offset, `text_offset[${i}] of '${generated.tokens[i]}'`);
    offset += generated.tokens[i].length;
  }
  const withPrompt = await greedy({ prompt: 'the café is', max_tokens: 2, logprobs: 0, echo: true });
  const all = withPrompt.choices[0].logprobs;
  const last = all.tokens.length - 1;
  // Whatever the BOS handling, the gap between the last two offsets is the length of the token between.
  assert.equal(all.text_offset[last] - all.text_offset[last - 1], all.tokens[last - 1].length);
  const cafe = all.tokens.findIndex((token) => token.includes('é'));
  assert.ok(cafe > 0);
  assert.equal(all.text_offset[cafe + 1] - all.text_offset[cafe], all.tokens[cafe].length,
    `'${all.tokens[cafe]}' spans ${all.text_offset[cafe + 1] - all.text_offset[cafe]} in text_offset`);
});

test('prompt_logprobs (vLLM form): null first, then the prompt token with its logprob', async () => {
  const completion = await greedy({ prompt: PROMPT, max_tokens: 1, prompt_logprobs: 2 });
  const { prompt_logprobs: promptLogprobs } = completion.choices[0];
  assert.equal(promptLogprobs.length, completion.usage.prompt_tokens);
  assert.equal(promptLogprobs[0], null);
  const { json } = await post('/tokenize', { prompt: PROMPT });
  for (let i = 1; i < promptLogprobs.length; i += 1) {
    const entry = promptLogprobs[i][String(json.tokens[i])];
    assert.ok(entry && entry.logprob <= 0, `prompt_logprobs[${i}] lacks token ${json.tokens[i]}`);
  }
});

test('return_token_ids (vLLM form): each choice has its prompt ids and generated ids, streamed the same', async () => {
  const body = { model: MODEL, prompt: PROMPT, max_tokens: 9, ignore_eos: true, n: 2, temperature: 0.9, seed: 5,
    logprobs: 0, return_token_ids: true };
  const { json: completion } = await post('/v1/completions', body);
  const { json: tokens } = await post('/tokenize', { prompt: PROMPT });
  assert.equal(completion.choices.length, 2);
  for (const choice of completion.choices) {
    assert.deepEqual(choice.prompt_token_ids, tokens.tokens);
    assert.equal(choice.token_ids.length, 9);
    assert.equal(choice.logprobs.tokens.length, 9);
  }
  const plain = await post('/v1/completions', { ...body, return_token_ids: false });
  assert.equal(plain.json.choices[0].token_ids, undefined);
  assert.equal(plain.json.choices[0].prompt_token_ids, undefined);
  const { events, done } = await rawStream('/v1/completions', body);
  assert.ok(done);
  const streamed = [[], []];
  const prompts = [];
  for (const event of events.slice(0, -1)) {
    for (const choice of JSON.parse(event).choices) {
      streamed[choice.index].push(...choice.token_ids);
      if (choice.prompt_token_ids) prompts[choice.index] = choice.prompt_token_ids;
    }
  }
  for (const [index, choice] of completion.choices.entries()) {
    assert.deepEqual(streamed[index], choice.token_ids);
    assert.deepEqual(prompts[index], tokens.tokens);
  }
});

test('return_routed_experts: every token read, each of the 4 MoE layers its 2 experts, as a replay routes them', async () => {
  const body = { model: MODEL, prompt: PROMPT, max_tokens: 6, ignore_eos: true, n: 2, temperature: 0.9, seed: 3,
    return_token_ids: true, return_routed_experts: true };
  const { json: completion } = await post('/v1/completions', body);
  const shaped = (routing) => routing.every((layers) => layers.length === 4 &&
    layers.every((experts) => experts.length === 2 && experts[0] < experts[1] && experts[0] >= 0 && experts[1] < 4));
  for (const choice of completion.choices) {
    assert.equal(choice.prompt_routed_experts.length, choice.prompt_token_ids.length);
    assert.equal(choice.routed_experts.length, choice.token_ids.length - 1);
    assert.ok(shaped(choice.prompt_routed_experts) && shaped(choice.routed_experts));
    // A trainer's forward pass over the rollout: the whole sequence as a prompt routes each token alike.
    const replay = await post('/v1/completions', { model: MODEL, prompt: [...choice.prompt_token_ids,
      ...choice.token_ids.slice(0, -1)], max_tokens: 1, return_routed_experts: true });
    assert.deepEqual(replay.json.choices[0].prompt_routed_experts,
      [...choice.prompt_routed_experts, ...choice.routed_experts]);
  }
  const { events } = await rawStream('/v1/completions', body);
  const last = events.slice(0, -1).map((event) => JSON.parse(event).choices[0]).filter((c) => c.finish_reason);
  for (const choice of last)
    assert.deepEqual(choice.routed_experts, completion.choices[choice.index].routed_experts);
  const plain = await post('/v1/completions', { ...body, return_routed_experts: false });
  assert.equal(plain.json.choices[0].routed_experts, undefined);
});

test('weight versions: GET /weight_version names the weights, and each choice says which sampled its tokens', async () => {
  assert.deepEqual(await (await fetch(`${BASE}/weight_version`)).json(), { weight_version: 'default' });
  const body = { model: MODEL, prompt: PROMPT, max_tokens: 5, ignore_eos: true, n: 2, seed: 1 };
  const { json } = await post('/v1/completions', body);
  for (const choice of json.choices)
    assert.deepEqual(choice.weight_versions, [{ version: 'default', start: 0, end: 5 }]);
  const { events } = await rawStream('/v1/completions', body);
  const last = events.slice(0, -1).map((event) => JSON.parse(event).choices[0]).filter((c) => c.finish_reason);
  assert.equal(last.length, 2);
  for (const choice of last) assert.deepEqual(choice.weight_versions, [{ version: 'default', start: 0, end: 5 }]);
});

test('stop strings end the text before the stop, with finish_reason stop', async () => {
  const full = (await greedy({ prompt: PROMPT, max_tokens: 40, ignore_eos: true })).choices[0].text;
  // A stop string from the middle of the greedy text: the text is cut just before it.
  const words = full.split(' ').filter((word) => /^[a-z]+$/.test(word));
  assert.ok(words.length >= 3, `greedy text too short to pick a stop word: '${full}'`);
  const stop = ` ${words[2]}`;
  const cut = full.slice(0, full.indexOf(stop));
  const stopped = await greedy({ prompt: PROMPT, max_tokens: 40, ignore_eos: true, stop });
  assert.equal(stopped.choices[0].text, cut);
  assert.equal(stopped.choices[0].finish_reason, 'stop');
  const list = await greedy({ prompt: PROMPT, max_tokens: 40, ignore_eos: true, stop: ['qqqq', stop] });
  assert.equal(list.choices[0].text, cut);
  const streamed = await openai.completions.create({
    model: MODEL, prompt: PROMPT, max_tokens: 40, ignore_eos: true, temperature: 0, stop, stream: true,
  });
  let text = '';
  let finish = null;
  for await (const chunk of streamed) {
    for (const choice of chunk.choices) {
      text += choice.text;
      finish = choice.finish_reason ?? finish;
    }
  }
  assert.equal(text, cut);
  assert.equal(finish, 'stop');
});

test('stop_token_ids and EOS end a choice with finish_reason stop', async () => {
  const full = await greedy({ prompt: PROMPT, max_tokens: 12, ignore_eos: true, logprobs: 0 });
  const { json } = await post('/tokenize', { prompt: full.choices[0].logprobs.tokens[2], add_special_tokens: false });
  assert.equal(json.count, 1);
  const stopped = await greedy({ prompt: PROMPT, max_tokens: 12, ignore_eos: true, stop_token_ids: json.tokens });
  assert.equal(stopped.choices[0].finish_reason, 'stop');
  assert.equal(stopped.usage.completion_tokens, 3);
  // As in vLLM, a stop token that is not a special token stays in the text.
  assert.equal(stopped.choices[0].text, full.choices[0].logprobs.tokens.slice(0, 3).join(''));
  // Without ignore_eos the demo model ends this sentence with EOS long before 200 tokens.
  const eos = await greedy({ prompt: PROMPT, max_tokens: 200 });
  assert.equal(eos.choices[0].finish_reason, 'stop');
  assert.ok(eos.usage.completion_tokens < 200);
  assert.ok(!eos.choices[0].text.includes('<|endoftext|>'));
});

test('/v1/models lists the served model', async () => {
  const models = [];
  for await (const model of openai.models.list()) models.push(model);
  assert.equal(models.length, 1);
  assert.equal(models[0].id, MODEL);
  assert.equal(models[0].object, 'model');
});

test('errors surface as the client APIError with status, message and param', async () => {
  await assert.rejects(greedy({ prompt: PROMPT, temperature: 3 }), (error) => {
    assert.ok(error instanceof openai.constructor.APIError, `not an APIError: ${error}`);
    assert.ok(error instanceof openai.constructor.BadRequestError);
    assert.equal(error.status, 400);
    assert.equal(error.param, 'temperature');
    assert.equal(error.type, 'invalid_request_error');
    assert.match(error.message, /temperature/);
    return true;
  });
  await assert.rejects(openai.completions.create({ model: 'gpt-4', prompt: PROMPT }), (error) => {
    assert.ok(error instanceof openai.constructor.NotFoundError);
    assert.equal(error.status, 404);
    assert.equal(error.param, 'model');
    assert.match(error.message, /gpt-4/);
    return true;
  });
  await assert.rejects(
    openai.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 4, stream: true, n: 0 }),
    (error) => error.status === 400 && error.param === 'n',
  );
});
