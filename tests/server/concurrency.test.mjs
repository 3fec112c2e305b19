// Law 5 over HTTP: 64 simultaneous streaming clients, each with its own greedy prompt; every
// response equals the same request run alone (text, tokens and logprobs, exactly).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { client, collectCompletion, MODEL, prompts, waitIdle, withTimeout } from './lib.mjs';

const NUM_CLIENTS = 64;
const openai = client();

function body(prompt) {
  return { model: MODEL, prompt, max_tokens: 24, temperature: 0, ignore_eos: true, logprobs: 1 };
}

test(`${NUM_CLIENTS} simultaneous streaming clients each get their greedy output run alone`, async () => {
  const all = prompts(NUM_CLIENTS);
  // Each request alone, one after the other: the reference.
  const alone = [];
  for (const prompt of all) {
    const completion = await openai.completions.create(body(prompt));
    const [choice] = completion.choices;
    alone.push({ text: choice.text, tokens: choice.logprobs.tokens, token_logprobs: choice.logprobs.token_logprobs });
  }
  assert.ok(new Set(alone.map((output) => output.text)).size > NUM_CLIENTS / 2, 'the prompts hardly differ');
  await waitIdle();

  // All at once, each on its own connection (a client each), streaming.
  const started = Date.now();
  const together = await withTimeout(
    Promise.all(all.map(async (prompt) => {
      const own = client();
      const stream = await own.completions.create({ ...body(prompt), stream: true });
      return (await collectCompletion(stream)).choices[0];
    })),
    90_000,
    `${NUM_CLIENTS} concurrent streams`,
  );
  const seconds = (Date.now() - started) / 1000;
  const mismatches = [];
  for (let i = 0; i < NUM_CLIENTS; i += 1) {
    const got = together[i];
    const want = alone[i];
    if (got.text !== want.text || JSON.stringify(got.tokens) !== JSON.stringify(want.tokens) ||
        JSON.stringify(got.token_logprobs) !== JSON.stringify(want.token_logprobs)) {
      mismatches.push(`client ${i} (${JSON.stringify(all[i].slice(0, 30))}): got ${JSON.stringify(got.text)}, ` +
        `alone ${JSON.stringify(want.text)}; logprobs ${JSON.stringify(got.token_logprobs.slice(0, 3))} vs ` +
        `${JSON.stringify(want.token_logprobs.slice(0, 3))}`);
    }
    assert.equal(got.finish_reason, 'length');
  }
  assert.deepEqual(mismatches, [], `${mismatches.length} of ${NUM_CLIENTS} responses differ from the request alone`);
  // The engine batched them: far faster than one after the other would have been.
  console.log(`# ${NUM_CLIENTS} clients x 24 tokens in ${seconds.toFixed(2)} s`);
  const idle = await waitIdle();
  assert.equal(idle.jambo_law_violations_total, 0);
});
