// Streaming (server-sent events) through the openai client's async iterator, and raw: the streamed
// text and logprobs equal the whole response's, include_usage adds a last usage chunk, [DONE] ends it.
// Also X-Request-Id: accepted, echoed, and carried into the engine's trace.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { client, collectChat, collectCompletion, MODEL, rawStream, sleep, waitIdle } from './lib.mjs';

const openai = client();
const PROMPT = 'Once upon a time';

test('completions: streamed text and logprobs equal the non-streamed response', async () => {
  const body = { model: MODEL, prompt: PROMPT, max_tokens: 24, temperature: 0, ignore_eos: true, logprobs: 2 };
  const whole = await openai.completions.create(body);
  const streamed = await collectCompletion(await openai.completions.create({ ...body, stream: true }));
  assert.equal(streamed.choices.length, 1);
  assert.equal(streamed.choices[0].text, whole.choices[0].text);
  assert.deepEqual(streamed.choices[0].tokens, whole.choices[0].logprobs.tokens);
  assert.deepEqual(streamed.choices[0].token_logprobs, whole.choices[0].logprobs.token_logprobs);
  assert.equal(streamed.choices[0].finish_reason, 'length');
  assert.ok(streamed.chunks >= 2, `one chunk for 24 tokens: not streamed`);
  assert.equal(streamed.usage, null);  // only with stream_options.include_usage
});

test('completions: include_usage, n > 1 and several prompts stream every choice', async () => {
  const body = { model: MODEL, prompt: [PROMPT, 'The river'], n: 2, max_tokens: 10, temperature: 0.8, seed: 3 };
  const whole = await openai.completions.create(body);
  const streamed = await collectCompletion(await openai.completions.create({
    ...body, stream: true, stream_options: { include_usage: true },
  }));
  assert.equal(streamed.choices.length, 4);
  assert.deepEqual(streamed.choices.map((c) => c.text), whole.choices.map((c) => c.text));
  assert.deepEqual(streamed.usage, whole.usage);
});

test('completions: echo with logprobs and stop strings streams as it answers whole', async () => {
  const body = { model: MODEL, prompt: PROMPT, max_tokens: 30, temperature: 0, ignore_eos: true, echo: true,
    logprobs: 1, stop: ['\n', ' time.'] };
  const whole = await openai.completions.create(body);
  const streamed = await collectCompletion(await openai.completions.create({ ...body, stream: true }));
  assert.ok(whole.choices[0].text.startsWith(PROMPT));
  assert.equal(streamed.choices[0].text, whole.choices[0].text);
  assert.deepEqual(streamed.choices[0].token_logprobs, whole.choices[0].logprobs.token_logprobs);
  assert.equal(streamed.choices[0].finish_reason, whole.choices[0].finish_reason);
});

test('completions: raw SSE: data lines, usage chunk last with no choices, then [DONE]', async () => {
  const { status, headers, events, done } = await rawStream('/v1/completions', {
    model: MODEL, prompt: PROMPT, max_tokens: 5, temperature: 0, ignore_eos: true, stream_options: { include_usage: true },
  });
  assert.equal(status, 200);
  assert.match(headers.get('content-type'), /^text\/event-stream/);
  assert.ok(done, `the stream does not end with [DONE]: ${events.at(-1)}`);
  const chunks = events.slice(0, -1).map((event) => JSON.parse(event));
  const usage = chunks.at(-1);
  assert.deepEqual(usage.choices, []);
  assert.equal(usage.usage.completion_tokens, 5);
  for (const chunk of chunks.slice(0, -1)) {
    assert.equal(chunk.object, 'text_completion');
    assert.equal(chunk.usage, null);
  }
  assert.equal(chunks.at(-2).choices[0].finish_reason, 'length');
});

test('chat: streamed content and logprobs equal the non-streamed response', async () => {
  const body = {
    model: MODEL, messages: [{ role: 'user', content: 'Write about winter.' }], max_tokens: 20, temperature: 0,
    ignore_eos: true, logprobs: true, top_logprobs: 2,
  };
  const whole = await openai.chat.completions.create(body);
  const streamed = await collectChat(await openai.chat.completions.create({
    ...body, stream: true, stream_options: { include_usage: true },
  }));
  assert.equal(streamed.choices.length, 1);
  assert.equal(streamed.choices[0].role, 'assistant');
  assert.equal(streamed.choices[0].content, whole.choices[0].message.content);
  assert.deepEqual(streamed.choices[0].logprobs, whole.choices[0].logprobs.content);
  assert.equal(streamed.choices[0].finish_reason, 'length');
  assert.deepEqual(streamed.usage, whole.usage);
});

test('chat: raw SSE chunks are chat.completion.chunk deltas ending with [DONE]', async () => {
  const { events, done } = await rawStream('/v1/chat/completions', {
    model: MODEL, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, temperature: 0, ignore_eos: true,
  });
  assert.ok(done);
  const chunks = events.slice(0, -1).map((event) => JSON.parse(event));
  assert.ok(chunks.every((chunk) => chunk.object === 'chat.completion.chunk' && chunk.id.startsWith('chatcmpl-')));
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  assert.equal(chunks.at(-1).choices[0].finish_reason, 'length');
  assert.ok(!('usage' in chunks[0]) || chunks[0].usage === null);
});

test('X-Request-Id: echoed on whole and streamed responses, named in the engine trace', async () => {
  const id = `e2e-${process.pid}-whole`;
  const { data, response } = await openai.completions
    .create({ model: MODEL, prompt: PROMPT, max_tokens: 3 }, { headers: { 'X-Request-Id': id } })
    .withResponse();
  assert.equal(response.headers.get('x-request-id'), id);
  assert.ok(data.id.includes(id), `response id '${data.id}' does not carry '${id}'`);

  const streamId = `e2e-${process.pid}-stream`;
  const { data: stream, response: streamResponse } = await openai.chat.completions
    .create({ model: MODEL, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 3, stream: true },
      { headers: { 'X-Request-Id': streamId } })
    .withResponse();
  assert.equal(streamResponse.headers.get('x-request-id'), streamId);
  await collectChat(stream);

  // Without one, the server makes one up and still answers with it.
  const { response: plain } = await openai.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 1 }).withResponse();
  assert.ok(plain.headers.get('x-request-id'));

  const tracePath = process.env.JAMBO_TRACE;
  if (!tracePath) return;  // the shared server runs with --trace when started by tests/server/server_test.sh
  await waitIdle();
  let trace = '';
  for (let tries = 0; tries < 20 && !(trace.includes(id) && trace.includes(streamId)); tries += 1) {
    await sleep(100);
    trace = readFileSync(tracePath, 'utf8');
  }
  for (const wanted of [id, streamId]) {
    const lines = trace.split('\n').filter((line) => line.includes(wanted));
    assert.ok(lines.length > 0, `the trace ${tracePath} never names ${wanted}`);
    // The engine's step lines name the request on its rows (law 6), not only in lifecycle events.
    assert.ok(lines.some((line) => /"rows"|"slot"/.test(line)), `no step row of ${wanted} in the trace`);
  }
});

// Callers repeat ids (retries, one id for a conversation): both requests run (a 400 before a81d279).
test('two concurrent requests with the same X-Request-Id both succeed', async () => {
  const headers = { 'X-Request-Id': `e2e-${process.pid}-twice` };
  const body = { model: MODEL, prompt: PROMPT, max_tokens: 30, ignore_eos: true, temperature: 0 };
  const [a, b] = await Promise.all([
    openai.completions.create(body, { headers }),
    openai.completions.create({ ...body, prompt: 'The river' }, { headers }),
  ]);
  assert.equal(a.usage.completion_tokens, 30);
  assert.equal(b.usage.completion_tokens, 30);
  assert.notEqual(a.id, b.id);
  assert.ok(a.id.includes(headers['X-Request-Id']) && b.id.includes(headers['X-Request-Id']));
});
