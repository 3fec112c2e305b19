// The malformed-request suite: every bad request gets its status and an OpenAI error object naming
// the offending field in `param`; none of them disturbs well-formed requests, leaks a slot or a
// KV block, or hurts the server.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { BASE, client, collectCompletion, MODEL, post, prompts, waitIdle, withTimeout } from './lib.mjs';

const C = '/v1/completions';
const H = '/v1/chat/completions';
const ok = { model: MODEL, prompt: 'Hello there', max_tokens: 4 };
const chat = { model: MODEL, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4 };
const user = (content) => ({ ...chat, messages: [{ role: 'user', content }] });
const nested = (depth) => `{"model": "${MODEL}", "prompt": ${'['.repeat(depth)}${']'.repeat(depth)}}`;

// [name, path, body (object, or a string sent as is), status, param (null: the error names no field), headers]
const CASES = [
  ['invalid JSON', C, '{"model": "jambo-demo", "prompt": ', 400, null],
  ['empty body', C, '', 400, null],
  ['a JSON array body', C, '[1, 2, 3]', 400, null],
  ['a JSON string body', C, '"hello"', 400, null],
  ['not UTF-8', C, Buffer.from([0x7b, 0x22, 0xff, 0xfe, 0x22, 0x3a, 0x31, 0x7d]), 400, null],
  ['deeply nested prompt', C, nested(100_000), 400, 'prompt'],
  ['a million levels of nesting', C, nested(1_000_000), 400, 'prompt'],
  ['nested one level too deep', H, `{"model": "${MODEL}", "messages": ${'['.repeat(256)}${']'.repeat(256)}}`, 400,
    'messages'],
  ['missing model', C, { prompt: 'Hi' }, 400, 'model'],
  ['model of wrong type', C, { ...ok, model: 5 }, 400, 'model'],
  ['wrong model', C, { ...ok, model: 'gpt-4o' }, 404, 'model'],
  ['missing prompt', C, { model: MODEL }, 400, 'prompt'],
  ['prompt a number', C, { ...ok, prompt: 12 }, 400, 'prompt'],
  ['prompt an object', C, { ...ok, prompt: { text: 'hi' } }, 400, 'prompt'],
  ['empty token list', C, { ...ok, prompt: [] }, 400, 'prompt'],
  ['empty nested token list', C, { ...ok, prompt: [[]] }, 400, 'prompt'],
  ['token id out of vocabulary', C, { ...ok, prompt: [1, 999_999] }, 400, 'prompt'],
  ['negative token id', C, { ...ok, prompt: [1, -3] }, 400, 'prompt'],
  ['fractional token id', C, { ...ok, prompt: [1.5, 2] }, 400, 'prompt'],
  ['prompts of mixed types', C, { ...ok, prompt: ['a', 5] }, 400, 'prompt'],
  ['too many prompts', C, { ...ok, prompt: Array(17).fill('hi') }, 400, 'prompt'],
  ['prompt longer than the context', C, { ...ok, prompt: Array(5000).fill(5) }, 400, 'prompt'],
  ['max_tokens negative', C, { ...ok, max_tokens: -1 }, 400, 'max_tokens'],
  ['max_tokens a string', C, { ...ok, max_tokens: 'ten' }, 400, 'max_tokens'],
  ['max_tokens fractional', C, { ...ok, max_tokens: 1.5 }, 400, 'max_tokens'],
  ['max_tokens too large for the context', C, { ...ok, max_tokens: 4095 }, 400, 'max_tokens'],
  ['max_tokens huge', C, { ...ok, max_tokens: 1e12 }, 400, 'max_tokens'],
  ['max_tokens past int64', C, `{"model": "${MODEL}", "prompt": "hi", "max_tokens": 99999999999999999999}`, 400, 'max_tokens'],
  ['temperature 3', C, { ...ok, temperature: 3 }, 400, 'temperature'],
  ['temperature negative', C, { ...ok, temperature: -0.5 }, 400, 'temperature'],
  ['temperature a string', C, { ...ok, temperature: 'hot' }, 400, 'temperature'],
  ['top_p 0', C, { ...ok, top_p: 0 }, 400, 'top_p'],
  ['top_p 1.5', C, { ...ok, top_p: 1.5 }, 400, 'top_p'],
  ['top_k -2', C, { ...ok, top_k: -2 }, 400, 'top_k'],
  ['min_p 2', C, { ...ok, min_p: 2 }, 400, 'min_p'],
  ['n 0', C, { ...ok, n: 0 }, 400, 'n'],
  ['n huge', C, { ...ok, n: 100_000 }, 400, 'n'],
  ['n times prompts over the slots', C, { ...ok, prompt: ['a', 'b'], n: 40 }, 400, 'n'],
  ['best_of unlike n', C, { ...ok, best_of: 3 }, 400, 'best_of'],
  ['logprobs 21', C, { ...ok, logprobs: 21 }, 400, 'logprobs'],
  ['logprobs true in completions', C, { ...ok, logprobs: true }, 400, 'logprobs'],
  ['prompt_logprobs 21', C, { ...ok, prompt_logprobs: 21 }, 400, 'prompt_logprobs'],
  ['echo a string', C, { ...ok, echo: 'yes' }, 400, 'echo'],
  ['return_token_ids a string', C, { ...ok, return_token_ids: 'yes' }, 400, 'return_token_ids'],
  ['stop a number', C, { ...ok, stop: 12 }, 400, 'stop'],
  ['stop holding a number', C, { ...ok, stop: ['a', 1] }, 400, 'stop'],
  ['stop empty', C, { ...ok, stop: '' }, 400, 'stop'],
  ['one stop string over 256 bytes', C, { ...ok, stop: 'x'.repeat(257) }, 400, 'stop'],
  ['a listed stop string over 256 bytes', C, { ...ok, stop: ['a', 'x'.repeat(257)] }, 400, 'stop'],
  ['too many stop strings', C, { ...ok, stop: Array.from({ length: 17 }, (_, i) => `s${i}`) }, 400, 'stop'],
  ['stop_token_ids out of vocabulary', C, { ...ok, stop_token_ids: [999_999] }, 400, 'stop_token_ids'],
  ['seed a string', C, { ...ok, seed: 'abc' }, 400, 'seed'],
  ['stream "yes"', C, { ...ok, stream: 'yes' }, 400, 'stream'],
  ['stream_options without stream', C, { ...ok, stream_options: { include_usage: true } }, 400, 'stream_options'],
  ['unknown stream option', C, { ...ok, stream: true, stream_options: { frob: true } }, 400, 'stream_options.frob'],
  ['unknown field', C, { ...ok, frobnicate: 1 }, 400, 'frobnicate'],
  ['messages sent to completions', C, { ...ok, messages: [] }, 400, 'messages'],
  ['presence_penalty non-zero', C, { ...ok, presence_penalty: 0.5 }, 400, 'presence_penalty'],
  ['frequency_penalty out of range', C, { ...ok, frequency_penalty: 5 }, 400, 'frequency_penalty'],
  ['logit_bias', C, { ...ok, logit_bias: { 5: 10 } }, 400, 'logit_bias'],
  ['suffix', C, { ...ok, suffix: 'end' }, 400, 'suffix'],
  ['user not a string', C, { ...ok, user: 5 }, 400, 'user'],
  ['messages missing', H, { model: MODEL, max_tokens: 4 }, 400, 'messages'],
  ['messages empty', H, { ...chat, messages: [] }, 400, 'messages'],
  ['messages a string', H, { ...chat, messages: 'hi' }, 400, 'messages'],
  ['message not an object', H, { ...chat, messages: [5] }, 400, 'messages[0]'],
  ['bad role', H, { ...chat, messages: [{ role: 'wizard', content: 'hi' }] }, 400, 'messages[0].role'],
  ['role missing', H, { ...chat, messages: [{ content: 'hi' }] }, 400, 'messages[0].role'],
  ['content of wrong type', H, user(5), 400, 'messages[0].content'],
  ['content part not text', H, user([{ type: 'image_url', image_url: { url: 'x' } }]), 400,
    'messages[0].content[0].type'],
  ['content part type a number', H, user([{ type: 'text', text: 'a' }, { type: 5 }]), 400, 'messages[0].content[1].type'],
  ['content part without a type', H, user([{ text: 'a' }]), 400, 'messages[0].content[0].type'],
  ['content part text a number', H, user([{ type: 'text', text: 5 }]), 400, 'messages[0].content[0].text'],
  ['content part a string', H, user(['hi']), 400, 'messages[0].content[0]'],
  ['unsupported message field', H, { ...chat, messages: [{ role: 'user', content: 'hi', tool_calls: [] }] }, 400,
    'messages[0].tool_calls'],
  ['top_logprobs without logprobs', H, { ...chat, top_logprobs: 2 }, 400, 'top_logprobs'],
  ['top_logprobs 21', H, { ...chat, logprobs: true, top_logprobs: 21 }, 400, 'top_logprobs'],
  ['chat logprobs a string', H, { ...chat, logprobs: 'yes' }, 400, 'logprobs'],
  ['response_format json', H, { ...chat, response_format: { type: 'json_object' } }, 400, 'response_format'],
  ['response_format type a number', H, { ...chat, response_format: { type: 5 } }, 400, 'response_format.type'],
  ['response_format a string', H, { ...chat, response_format: 'text' }, 400, 'response_format'],
  ['tools', H, { ...chat, tools: [{ type: 'function', function: { name: 'f' } }] }, 400, 'tools'],
  ['tool_choice auto', H, { ...chat, tool_choice: 'auto' }, 400, 'tool_choice'],
  ['max_completion_tokens over the context', H, { ...chat, max_completion_tokens: 100_000 }, 400, 'max_completion_tokens'],
  ['prompt sent to chat', H, { ...chat, prompt: 'hi' }, 400, 'prompt'],
  ['chat prompt longer than the context', H, user('word '.repeat(5000)), 400, 'messages'],
  ['chat n 0', H, { ...chat, n: 0 }, 400, 'n'],
  ['chat stream "yes"', H, { ...chat, stream: 'yes' }, 400, 'stream'],
  ['chat unknown field', H, { ...chat, functions: [] }, 400, 'functions'],
  ['chat top_logprobs negative', H, { ...chat, logprobs: true, top_logprobs: -1 }, 400, 'top_logprobs'],
  ['chat token id stop out of vocabulary', H, { ...chat, stop_token_ids: [999_999] }, 400, 'stop_token_ids'],
  ['chat max_tokens negative', H, { ...chat, max_tokens: -5 }, 400, 'max_tokens'],
  ['chat wrong model', H, { ...chat, model: 'nope' }, 404, 'model'],
  ['X-Request-Id with a space', C, ok, 400, 'X-Request-Id', { 'X-Request-Id': 'has a space' }],
  ['X-Request-Id too long', C, ok, 400, 'X-Request-Id', { 'X-Request-Id': 'x'.repeat(200) }],
  ['tokenize a number', '/tokenize', { prompt: 5 }, 400, 'prompt'],
  ['tokenize unknown field', '/tokenize', { prompt: 'a', frob: 1 }, 400, 'frob'],
  ['detokenize out of vocabulary', '/detokenize', { tokens: [1, 999_999] }, 400, 'tokens'],
  ['unknown route', '/v1/frobnicate', ok, 404, null],
  ['legacy engines route', '/v1/engines/jambo-demo/completions', ok, 404, null],
];

async function check([name, path, body, status, param, headers = {}]) {
  const response = await post(path, body, headers);
  const where = `${name}: ${response.status} ${response.text.slice(0, 300)}`;
  assert.equal(response.status, status, where);
  assert.match(response.headers.get('content-type') ?? '', /^application\/json/, where);
  const error = response.json?.error;
  assert.ok(error && typeof error.message === 'string' && error.message.length > 0, `no error object: ${where}`);
  assert.deepEqual(Object.keys(error).sort(), ['code', 'message', 'param', 'type'], where);
  assert.equal(error.param, param, where);
  if (status === 400) assert.equal(error.type, 'invalid_request_error', where);
  if (param && !param.startsWith('X-')) assert.ok(error.message.includes(param.split('.')[0].split('[')[0]), where);
}

const greedyBody = (prompt) => ({ model: MODEL, prompt, max_tokens: 24, temperature: 0, ignore_eos: true, logprobs: 1 });

test(`the malformed-request suite (${CASES.length} cases)`, async (t) => {
  assert.ok(CASES.length >= 30);
  for (const testCase of CASES) await t.test(testCase[0], () => check(testCase));
});

test('a body over the size limit gets 413 with an error object', async () => {
  const response = await post(C, { ...ok, prompt: 'a'.repeat(17 << 20) });
  assert.equal(response.status, 413);
  assert.match(response.json.error.message, /too large/);
});

// An application/x-www-form-urlencoded body (what `curl -d` sends) was once read only up to 8 KiB and refused
// with 413 "too large" past that: the body must be read, or the 413 must say it is the content type.
test('a JSON body over 8 KiB sent as a form (curl -d) is read, or refused naming the Content-Type',
  async () => {
    const body = JSON.stringify({ ...ok, prompt: 'word '.repeat(2000), max_tokens: 1 });
    const response = await post(C, body, { 'Content-Type': 'application/x-www-form-urlencoded' });
    if (response.status !== 200) {
      assert.equal(response.status, 413, response.text.slice(0, 200));
      assert.match(response.json.error.message, /Content-Type/, response.text.slice(0, 200));
    }
  });

test('after the flood: a well-formed request answers correctly, /health is 200, no slot leaked', async () => {
  const openai = client();
  const before = await openai.completions.create(greedyBody('After the flood'));
  await Promise.all(CASES.map(([, path, body, , , headers]) => post(path, body, headers)));
  const after = await openai.completions.create(greedyBody('After the flood'));
  assert.deepEqual(after.choices, before.choices);
  assert.equal((await fetch(`${BASE}/health`)).status, 200);
  const idle = await waitIdle();
  assert.equal(idle.jambo_engine_alive, 1);
});

test('malformed requests while well-formed streams run leave those streams unchanged', async () => {
  const openai = client();
  const all = prompts(8);
  const alone = [];
  for (const prompt of all) alone.push((await openai.completions.create(greedyBody(prompt))).choices[0]);
  const streams = all.map(async (prompt) => (await collectCompletion(
    await client().completions.create({ ...greedyBody(prompt), stream: true }))).choices[0]);
  // Two rounds of every malformed case, fired while the streams run.
  const flood = Promise.all([...CASES, ...CASES].map(async (testCase) => check(testCase)));
  const [outputs] = await withTimeout(Promise.all([Promise.all(streams), flood]), 60_000, 'streams under a flood');
  for (let i = 0; i < all.length; i += 1) {
    assert.equal(outputs[i].text, alone[i].text, `stream ${i}`);
    assert.deepEqual(outputs[i].token_logprobs, alone[i].logprobs.token_logprobs, `stream ${i}`);
  }
  await waitIdle();
});
