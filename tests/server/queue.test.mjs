// The queue bound: a server started with --max-num-requests 4 answers a fifth concurrent request with
// 429 and Retry-After, keeps serving the four, and takes new requests once they finished or left.
import assert from 'node:assert/strict';
import { request } from 'node:http';
import { after, before, test } from 'node:test';
import { client, collectCompletion, MODEL, post, sleep, startServer, waitIdle } from './lib.mjs';

let server;
let openai;
before(async () => {
  server = await startServer('queue', ['--max-num-requests', '4']);
  openai = client(server.url);
});
after(async () => {
  assert.equal(await server.stop(), 0, 'the server did not stop cleanly on SIGTERM');
});

const SLOW = { model: MODEL, max_tokens: 200, ignore_eos: true, temperature: 0 };

// Opens a stream of maxTokens and waits for its first chunk (the request is then held by the engine); returns
// {first, rest} where rest resolves to the collected output.
async function hold(prompt, signal, maxTokens = 400) {
  const stream = await client(server.url).completions.create(
    { ...SLOW, prompt, max_tokens: maxTokens, stream: true }, { signal });
  const iterator = stream[Symbol.asyncIterator]();
  const first = await iterator.next();
  const rest = (async () => {
    let text = first.value.choices[0]?.text ?? '';
    let finish = null;
    for (let next = await iterator.next(); !next.done; next = await iterator.next())
      for (const choice of next.value.choices) {
        text += choice.text;
        finish = choice.finish_reason ?? finish;
      }
    return { text, finish };
  })();
  return { first, rest };
}

test('a fifth request gets 429 with Retry-After; later requests succeed once the four finished', async () => {
  const held = await Promise.all(['one', 'two', 'three', 'four'].map((prompt) => hold(prompt)));
  await assert.rejects(openai.completions.create({ ...SLOW, prompt: 'five', max_tokens: 2 }), (error) => {
    assert.ok(error instanceof openai.constructor.RateLimitError, `not a RateLimitError: ${error}`);
    assert.equal(error.status, 429);
    assert.ok(Number(error.headers.get('retry-after')) >= 1, 'no Retry-After header');
    assert.ok(error.message.length > 0);
    return true;
  });
  // Streaming and chat are refused the same way; /health and /metrics still answer.
  const refused = await post('/v1/chat/completions',
    { model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, stream: true }, {}, server.url);
  assert.equal(refused.status, 429);
  assert.equal(refused.json.error.type, 'rate_limit_exceeded');
  assert.equal((await fetch(`${server.url}/health`)).status, 200);
  const outputs = await Promise.all(held.map(({ rest }) => rest));
  for (const output of outputs) assert.equal(output.finish, 'length');
  await waitIdle(server.url);
  // The four places are free again: four at once succeed, a request of two prompts too.
  const again = await Promise.all(['a', 'b', 'c', 'd'].map((prompt) =>
    client(server.url).completions.create({ ...SLOW, prompt, max_tokens: 4 })));
  assert.ok(again.every((completion) => completion.usage.completion_tokens === 4));
  const pair = await openai.completions.create({ ...SLOW, prompt: ['x', 'y'], max_tokens: 2 });
  assert.equal(pair.choices.length, 2);
});

test('requests count by prompt; refusals, errors and clients that left give their places back', async () => {
  const controllers = [new AbortController(), new AbortController(), new AbortController()];
  const held = await Promise.all(controllers.map((controller, i) => hold(`held ${i}`, controller.signal)));
  // Three held: a request of two prompts does not fit, one of one prompt does.
  const two = await post('/v1/completions', { ...SLOW, prompt: ['x', 'y'], max_tokens: 2 }, {}, server.url);
  assert.equal(two.status, 429);
  assert.ok(two.headers.get('retry-after'));
  for (let i = 0; i < 20; i += 1) {
    const bad = await post('/v1/completions', { ...SLOW, prompt: 'x', temperature: 9 }, {}, server.url);
    assert.equal(bad.status, 400);
  }
  const one = await openai.completions.create({ ...SLOW, prompt: 'fits', max_tokens: 2 });
  assert.equal(one.usage.completion_tokens, 2);
  for (const controller of controllers) controller.abort();
  await Promise.allSettled(held.map(({ rest }) => rest));
  await waitIdle(server.url, 2000);
  const streams = await Promise.all(['p', 'q', 'r', 's'].map(async (prompt) =>
    collectCompletion(await client(server.url).completions.create({ ...SLOW, prompt, max_tokens: 3, stream: true }))));
  assert.ok(streams.every((stream) => stream.choices[0].finish_reason === 'length'));
});

// GET on a connection of its own (not one of fetch's pooled keep-alive connections): {status, ms}.
function freshGet(url) {
  const started = performance.now();
  return new Promise((resolve, reject) => {
    request(url, { agent: false }, (response) => {
      response.resume();
      response.on('end', () => resolve({ status: response.statusCode, ms: performance.now() - started }));
    }).on('error', reject).end();
  });
}

// A refusal closes its connection, and a flood of refused clients (each on its own connection, as fetch and the
// openai client keep them) must neither slow the refusals nor keep /health waiting.
test('under a flood of refused requests, refusals come fast and /health answers at once', async () => {
    const controllers = [0, 1, 2, 3].map(() => new AbortController());
    const held = await Promise.all(controllers.map((controller, i) => hold(`busy ${i}`, controller.signal, 3000)));
    try {
      const started = performance.now();
      const flood = Promise.all(Array.from({ length: 40 }, async () => {
        const response = await post('/v1/completions', { ...SLOW, prompt: 'y', max_tokens: 2 }, {}, server.url);
        return { status: response.status, ms: performance.now() - started };
      }));
      await sleep(300);
      const health = await freshGet(`${server.url}/health`);
      const refusals = await flood;
      assert.deepEqual(refusals.filter((refusal) => refusal.status !== 429), []);
      assert.equal(health.status, 200);
      assert.ok(health.ms < 1000, `/health took ${health.ms.toFixed(0)} ms during the flood`);
      const slowest = Math.max(...refusals.map((refusal) => refusal.ms));
      assert.ok(slowest < 2000, `the slowest 429 took ${slowest.toFixed(0)} ms`);
    } finally {
      for (const controller of controllers) controller.abort();
      await Promise.allSettled(held.map(({ rest }) => rest));
      await waitIdle(server.url, 2000);
    }
  });
