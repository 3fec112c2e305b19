// Law 5 over HTTP: 64 simultaneous streaming clients, each with its own greedy prompt; every
// response equals the same request run alone (text, tokens and logprobs, exactly).
import assert from 'node:assert/strict';
import net from 'node:net';
import { test } from 'node:test';
import { client, collectCompletion, MODEL, prompts, startServer, waitIdle, withTimeout } from './lib.mjs';

const NUM_CLIENTS = 64;
const openai = client();

function body(prompt) {
  return { model: MODEL, prompt, max_tokens: 24, temperature: 0, ignore_eos: true, logprobs: 1 };
}

// All clients at once, each on its own connection, streaming; returns [{text, tokens, token_logprobs,
// finish_reason}] in prompt order.
async function allAtOnce(base, all) {
  return withTimeout(
    Promise.all(all.map(async (prompt) => {
      const stream = await client(base).completions.create({ ...body(prompt), stream: true });
      return (await collectCompletion(stream)).choices[0];
    })),
    90_000,
    `${all.length} concurrent streams`,
  );
}

function differences(all, together, alone) {
  const mismatches = [];
  for (let i = 0; i < all.length; i += 1) {
    const got = together[i];
    const want = alone[i];
    if (got.text !== want.text || JSON.stringify(got.tokens) !== JSON.stringify(want.tokens) ||
        JSON.stringify(got.token_logprobs) !== JSON.stringify(want.token_logprobs) || got.finish_reason !== 'length') {
      mismatches.push(`client ${i} (${JSON.stringify(all[i].slice(0, 30))}): got ${JSON.stringify(got.text)}, ` +
        `alone ${JSON.stringify(want.text)}; logprobs ${JSON.stringify(got.token_logprobs.slice(0, 3))} vs ` +
        `${JSON.stringify(want.token_logprobs.slice(0, 3))}`);
    }
  }
  return mismatches;
}

const all = prompts(NUM_CLIENTS);
const alone = [];

test(`${NUM_CLIENTS} simultaneous streaming clients each get their greedy output run alone`, async () => {
  // Each request alone, one after the other: the reference.
  for (const prompt of all) {
    const completion = await openai.completions.create(body(prompt));
    const [choice] = completion.choices;
    alone.push({ text: choice.text, tokens: choice.logprobs.tokens, token_logprobs: choice.logprobs.token_logprobs });
  }
  assert.ok(new Set(alone.map((output) => output.text)).size > NUM_CLIENTS / 2, 'the prompts hardly differ');
  await waitIdle();

  const started = Date.now();
  const together = await allAtOnce(undefined, all);
  const seconds = (Date.now() - started) / 1000;
  const mismatches = differences(all, together, alone);
  assert.deepEqual(mismatches, [], `${mismatches.length} of ${NUM_CLIENTS} responses differ from the request alone`);
  console.log(`# ${NUM_CLIENTS} clients x 24 tokens in ${seconds.toFixed(2)} s`);
  const idle = await waitIdle();
  assert.equal(idle.jambo_law_violations_total, 0);
});

// The same clients against a server whose memory holds a few sequences: most wait, running ones are
// preempted and recomputed, prefill is chunked by a small token budget; the outputs must not change.
test(`${NUM_CLIENTS} clients on a server short of memory (waiting, preemption, chunked prefill)`, async () => {
  assert.equal(alone.length, NUM_CLIENTS, 'the reference outputs of the first test are missing');
  const tight = await startServer('tight', ['--memory-budget', '19MiB', '--max-model-len', '128',
    '--max-num-batched-tokens', '32', '--check']);
  try {
    const together = await allAtOnce(tight.url, all);
    const mismatches = differences(all, together, alone);
    assert.deepEqual(mismatches, [], `${mismatches.length} of ${NUM_CLIENTS} responses differ from the request alone`);
    const idle = await waitIdle(tight.url);
    assert.ok(idle.jambo_preemptions_total > 0, 'no preemption: the test does not test it');
    assert.equal(idle.jambo_law_violations_total, 0);
    console.log(`# tight server: ${idle.jambo_preemptions_total} preemptions, ${idle.jambo_slot_reuses_total} slot reuses`);
  } finally {
    assert.equal(await tight.stop(), 0);
  }
});

// A burst of clients connecting at once, faster than the server accepts (here it is stopped: SIGSTOP): the
// kernel completes every handshake into the listen backlog, and each is served once the server runs again. With a
// backlog of 5, all but six would wait for SYN retries (a second and more), or be reset.
test(`${NUM_CLIENTS} connections made while the server accepts none are all served`, async () => {
  const burst = await startServer('burst');
  const { hostname, port } = new URL(burst.url);
  const sockets = [];
  try {
    burst.signal('SIGSTOP');
    const connected = await Promise.all(Array.from({ length: NUM_CLIENTS }, () => new Promise((resolve) => {
      const socket = net.connect({ host: hostname, port: Number(port) });
      sockets.push(socket);
      const timer = setTimeout(() => resolve(false), 700);
      socket.on('connect', () => { clearTimeout(timer); resolve(true); });
      socket.on('error', () => { clearTimeout(timer); resolve(false); });
    })));
    assert.equal(connected.filter(Boolean).length, NUM_CLIENTS, 'handshakes completed within 0.7 s while stopped');
    burst.signal('SIGCONT');
    const answers = await withTimeout(Promise.all(sockets.map((socket) => new Promise((resolve) => {
      let text = '';
      socket.on('data', (data) => { text += data; });
      socket.on('end', () => resolve(text));
      socket.on('error', (error) => resolve(`error ${error.code}`));
      socket.write(`GET /health HTTP/1.1\r\nHost: ${hostname}\r\nConnection: close\r\n\r\n`);
    }))), 30_000, `${NUM_CLIENTS} health requests`);
    const served = answers.filter((text) => text.startsWith('HTTP/1.1 200')).length;
    assert.equal(served, NUM_CLIENTS, `answers: ${JSON.stringify(answers.find((text) => !text.startsWith('HTTP/1.1 200')))}`);
  } finally {
    burst.signal('SIGCONT');
    for (const socket of sockets) socket.destroy();
    assert.equal(await burst.stop(), 0);
  }
});

// Seeded sampling (temperature, top_p, top_k, n = 2) is as independent of the batch as greedy decoding.
test('16 concurrent seeded sampling clients (n = 2) each get their output run alone', async () => {
  const sampled = prompts(16);
  const request = (prompt, i) => ({ model: MODEL, prompt, max_tokens: 24, temperature: 1, top_p: 0.9, top_k: 50,
    seed: 1000 + i, n: 2, logprobs: 1, ignore_eos: true });
  const key = (text, logprobs) => `${text} ${JSON.stringify(logprobs)}`;
  const reference = [];
  for (const [i, prompt] of sampled.entries()) {
    const completion = await openai.completions.create(request(prompt, i));
    reference.push(completion.choices.map((choice) => key(choice.text, choice.logprobs.token_logprobs)));
  }
  assert.ok(reference.every(([a, b]) => a !== b), 'two samples of one seeded request are equal');
  const together = await withTimeout(Promise.all(sampled.map(async (prompt, i) => {
    const stream = await client().completions.create({ ...request(prompt, i), stream: true });
    return (await collectCompletion(stream)).choices.map((choice) => key(choice.text, choice.token_logprobs));
  })), 60_000, '16 seeded streams');
  assert.deepEqual(together, reference);
  await waitIdle();
});
