// A client that leaves mid-stream aborts its request: its state slot and KV blocks return to the pool
// within two seconds, and the engine keeps serving (the others unchanged).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { BASE, client, collectCompletion, metrics, MODEL, sleep, startServer, waitIdle } from './lib.mjs';

const openai = client();
const LONG = { model: MODEL, max_tokens: 2000, ignore_eos: true, temperature: 0 };
const greedy = (prompt) => ({ model: MODEL, prompt, max_tokens: 24, temperature: 0, ignore_eos: true, logprobs: 1 });

// Starts a long stream, reads `chunks` chunks, then aborts it; returns how many chunks were read.
async function leaveEarly(create, chunks = 3) {
  const controller = new AbortController();
  const stream = await create(controller.signal);
  let read = 0;
  try {
    for await (const chunk of stream) {
      assert.ok(chunk);
      read += 1;
      if (read === chunks) controller.abort();
    }
  } catch (error) {
    if (!(error instanceof openai.constructor.APIUserAbortError) && error.name !== 'AbortError') throw error;
  }
  return read;
}

test('a completions stream aborted after a few chunks frees its slot and blocks within 2 s', async () => {
  const reference = (await openai.completions.create(greedy('The old house'))).choices[0];
  await waitIdle();
  const read = await leaveEarly((signal) =>
    openai.completions.create({ ...LONG, prompt: 'Once upon a time', stream: true }, { signal }));
  assert.ok(read >= 3);
  const during = await metrics();
  assert.ok(during.jambo_state_slots_used <= 1);
  await waitIdle(BASE, 2000);
  // Still serving, and serving the same tokens.
  const after = (await openai.completions.create(greedy('The old house'))).choices[0];
  assert.deepEqual(after, reference);
});

test('chat and n > 1 streams aborted together free every slot; a stream alongside is unchanged', async () => {
  const reference = (await openai.completions.create(greedy('The winter garden'))).choices[0];
  const survivor = (async () => (await collectCompletion(await client().completions.create(
    { ...greedy('The winter garden'), stream: true }))).choices[0])();
  const leavers = [
    leaveEarly((signal) => client().chat.completions.create(
      { ...LONG, messages: [{ role: 'user', content: 'Tell me a long story.' }], stream: true }, { signal })),
    leaveEarly((signal) => client().completions.create(
      { ...LONG, prompt: ['a', 'b'], n: 3, temperature: 1, seed: 5, stream: true }, { signal }), 5),
    ...Array.from({ length: 6 }, (_, i) => leaveEarly((signal) => client().completions.create(
      { ...LONG, prompt: `Story number ${i}`, stream: true }, { signal }), 2 + i)),
  ];
  await Promise.all(leavers);
  const kept = await survivor;
  assert.equal(kept.text, reference.text);
  assert.deepEqual(kept.token_logprobs, reference.logprobs.token_logprobs);
  await waitIdle(BASE, 2000);
});

test('a client that closes the socket of a raw SSE stream frees its slot', async () => {
  const controller = new AbortController();
  const response = await fetch(`${BASE}/v1/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ ...LONG, prompt: 'The river', stream: true }),
    signal: controller.signal,
  });
  const reader = response.body.getReader();
  await reader.read();
  assert.equal((await metrics()).jambo_state_slots_used, 1);
  controller.abort();
  await waitIdle(BASE, 2000);
});

test('a client that leaves while its request waits for a sequence place is taken off the queue', async () => {
  const server = await startServer('one-seq', ['--max-num-seqs', '1']);
  try {
    const running = new AbortController();
    const first = await client(server.url).completions.create(
      { ...LONG, prompt: 'The first', stream: true }, { signal: running.signal });
    const read = (async () => {
      for await (const chunk of first) assert.ok(chunk);
    })();
    for (let tries = 0; tries < 100 && (await metrics(server.url)).jambo_num_requests_running === 0; tries += 1) {
      await sleep(20);
    }
    const waiting = new AbortController();
    const pending = client(server.url).completions.create(
      { ...LONG, prompt: 'The second', stream: true }, { signal: waiting.signal });
    pending.catch(() => {});
    for (let tries = 0; tries < 100 && (await metrics(server.url)).jambo_num_requests_waiting === 0; tries += 1) {
      await sleep(20);
    }
    assert.equal((await metrics(server.url)).jambo_num_requests_waiting, 1);
    waiting.abort();
    const deadline = Date.now() + 2000;
    while ((await metrics(server.url)).jambo_num_requests_waiting !== 0) {
      assert.ok(Date.now() < deadline, 'the waiting request is still queued 2 s after its client left');
      await sleep(50);
    }
    assert.equal((await metrics(server.url)).jambo_num_requests_running, 1);
    running.abort();
    await read.catch(() => {});
  } finally {
    await server.stop();
  }
});

// A whole (non-streaming) response is written once it is complete, so the server never learns that its
// client left: the request runs to max_tokens, holding its slot and blocks. A server of its own, so that
// the shared one is not kept busy when this fails.
describe('a long non-streaming request', { concurrency: false }, () => {
  let server;
  before(async () => {
    server = await startServer('whole');
  });
  after(async () => {
    await server.stop().catch(() => {});
  });

  // Waits until the server runs a request.
  async function running() {
    for (let tries = 0; tries < 250 && (await metrics(server.url)).jambo_state_slots_used === 0; tries += 1) {
      await sleep(20);
    }
  }

  test('frees its slot once its client left', async () => {
    const controller = new AbortController();
    const pending = client(server.url).completions.create(
      { ...LONG, max_tokens: 4000, prompt: 'The city at night' }, { signal: controller.signal });
    pending.catch(() => {});
    await running();
    controller.abort();
    await waitIdle(server.url, 2000);
  });

  // Before 3bd53c8, SIGTERM waited for every whole request to run to max_tokens.
  test('does not hold up SIGTERM for long', async () => {
    const pending = client(server.url).completions.create({ ...LONG, max_tokens: 4000, prompt: 'The long night' });
    pending.catch(() => {});
    await running();
    // Streams are cut at once; a whole request may finish its step, not its 4000 tokens.
    assert.equal(await server.stop(5000), 0);
  });
});
