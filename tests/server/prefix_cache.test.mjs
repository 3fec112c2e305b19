// Prefix caching over HTTP: a second chat turn that sends the first turn's conversation again resumes from the
// cache (/metrics counts the tokens), with the logprobs a cold server gives; POST /reset_prefix_cache (a control
// endpoint) empties the cache; --no-enable-prefix-caching turns it off and /metrics then has no prefix_cache lines.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { BASE, MODEL, metrics, post, startServer } from './lib.mjs';

let cached;
let cold;

before(async () => {
  cached = await startServer('prefix-cached', ['--enable-control-endpoints']);
  cold = await startServer('prefix-cold', ['--no-enable-prefix-caching']);
});
after(async () => {
  assert.equal(await cached.stop(), 0, 'the caching server did not stop cleanly on SIGTERM');
  assert.equal(await cold.stop(), 0, 'the cold server did not stop cleanly on SIGTERM');
});

const HISTORY = 'Once upon a time there was a little cat who lived in a big house with a garden full of flowers and a ' +
  'tall tree where the birds sang every morning.';

async function logprobs(base, prompt) {
  const body = { model: MODEL, prompt, max_tokens: 6, temperature: 0, logprobs: 2, ignore_eos: true };
  const response = await post('/v1/completions', body, {}, base);
  assert.equal(response.status, 200, response.text);
  return response.json.choices[0].logprobs;
}

test('a second turn resumes from the first turn\'s prompt, with the cold server\'s logprobs', async () => {
  const before = await metrics(cached.url);
  await logprobs(cached.url, HISTORY);
  const turn2 = `${HISTORY} The cat climbed the tree.`;
  const resumed = await logprobs(cached.url, turn2);
  assert.deepEqual(resumed, await logprobs(cold.url, turn2));
  const now = await metrics(cached.url);
  assert.ok(now.jambo_prefix_cache_hits_total - before.jambo_prefix_cache_hits_total >= 16,
    `hits ${now.jambo_prefix_cache_hits_total}`);
  assert.ok(now.jambo_prefix_cache_queries_total > now.jambo_prefix_cache_hits_total);
  assert.ok(now.jambo_prefix_cache_checkpoints_used >= 1);
  assert.ok(now['jambo_prefix_cache_misses_total{reason="no_checkpoint"}'] >= 1);
});

test('POST /reset_prefix_cache empties the cache; the next turn misses and answers the same', async () => {
  await logprobs(cached.url, HISTORY);
  const reset = await post('/reset_prefix_cache', {}, {}, cached.url);
  assert.equal(reset.status, 200, reset.text);
  assert.equal(reset.json.success, true);
  const emptied = await metrics(cached.url);
  assert.equal(emptied.jambo_prefix_cache_checkpoints_used, 0);
  assert.equal(emptied.jambo_prefix_cache_kv_blocks, 0);
  const turn2 = `${HISTORY} The cat slept.`;
  assert.deepEqual(await logprobs(cached.url, turn2), await logprobs(cold.url, turn2));
  assert.equal((await metrics(cached.url)).jambo_prefix_cache_hits_total, emptied.jambo_prefix_cache_hits_total);
});

test('without --enable-control-endpoints there is no /reset_prefix_cache', async () => {
  assert.equal((await post('/reset_prefix_cache', {}, {}, BASE)).status, 404);
});

test('--no-enable-prefix-caching: no prefix_cache metrics', async () => {
  const values = await metrics(cold.url);
  assert.equal(Object.keys(values).some((name) => name.startsWith('jambo_prefix_cache')), false);
});
