// POST /sleep, /wake_up and GET /is_sleeping on a running server (vLLM's names): a request sent while the engine
// sleeps waits, neither refused nor run, until both the weights and the caches are woken, and then gives the
// logprobs it would have given awake; level 1 keeps the weights an update brought, level 2 wakes with the
// checkpoint's, named as they were at the start. Bad levels and tags answer 400; without --enable-control-endpoints the endpoints do not exist.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { BASE, MODEL, WORK, demoHeader, post, sleep, startServer, writeOneTensor } from './lib.mjs';

const ROOT = join(WORK, 'sleep-weights');
const NORM = 'model.final_layernorm.weight';
let server;

before(async () => {
  const norm = demoHeader()[NORM];
  writeOneTensor(join(ROOT, 'norm-2'), NORM, norm.dtype, norm.shape, 2.0);
  server = await startServer('sleep', ['--enable-control-endpoints', '--allowed-weight-paths', ROOT]);
});
after(async () => {
  assert.equal(await server.stop(), 0, 'the server did not stop cleanly on SIGTERM');
});

const control = async (path) => {
  const response = await post(path, {}, {}, server.url);
  assert.equal(response.status, 200, `${path}: ${response.text}`);
  return response.json;
};
const isSleeping = async () => (await (await fetch(`${server.url}/is_sleeping`)).json()).is_sleeping;
const GREEDY = { model: MODEL, prompt: 'The meaning of life is', max_tokens: 8, temperature: 0, logprobs: 1, ignore_eos: true };
async function complete() {
  const response = await post('/v1/completions', GREEDY, {}, server.url);
  assert.equal(response.status, 200, response.text);
  return response.json.choices[0].logprobs.token_logprobs;
}

test('without --enable-control-endpoints there is no /sleep, /wake_up or /is_sleeping', async () => {
  for (const path of ['/sleep', '/wake_up']) assert.equal((await post(path, {}, {}, BASE)).status, 404, path);
  assert.equal((await fetch(`${BASE}/is_sleeping`)).status, 404);
});

test('a request sent while asleep waits for both halves of the wake, then answers as before', async () => {
  const awake = await complete();
  assert.equal(await isSleeping(), false);
  const slept = await control('/sleep?level=1');
  assert.equal(slept.sleeping, true);
  assert.equal(slept.level, 1);
  assert.equal(await isSleeping(), true);

  let answered = false;
  const pending = complete().then((logprobs) => { answered = true; return logprobs; });
  await sleep(500);
  assert.equal(answered, false, 'a request ran while the engine slept');
  const half = await control('/wake_up?tags=weights');
  assert.deepEqual([half.sleeping, half.weights_asleep, half.kv_cache_asleep], [true, false, true]);
  await sleep(300);
  assert.equal(answered, false, 'a request ran with the caches asleep');
  const woken = await control('/wake_up?tags=kv_cache');
  assert.equal(woken.sleeping, false);
  assert.deepEqual(await pending, awake);
  assert.equal(await isSleeping(), false);
});

test('level 1 keeps the weights of an update, level 2 wakes with the checkpoint', async () => {
  const checkpoint = await complete();
  const update = await post('/update_weights_from_disk', { model_path: join(ROOT, 'norm-2'), weight_version: 'norm-2' },
                            {}, server.url);
  assert.equal(update.status, 200, update.text);
  const updated = await complete();
  assert.notDeepEqual(updated, checkpoint);

  await control('/sleep?level=1');
  await control('/wake_up');
  assert.deepEqual(await complete(), updated, 'a level 1 sleep lost the update');

  await control('/sleep?level=2');
  const woken = await control('/wake_up?tags=weights,kv_cache');
  assert.equal(woken.weight_version, 'default', 'the checkpoint read again is named as at the start');
  assert.deepEqual(await complete(), checkpoint, 'a level 2 wake did not read the checkpoint again');
  assert.equal((await (await fetch(`${server.url}/weight_version`)).json()).weight_version, 'default');
});

test('bad levels and tags answer 400 and leave the engine awake', async () => {
  const level = await post('/sleep?level=3', {}, {}, server.url);
  assert.equal(level.status, 400, level.text);
  assert.match(level.json.error.message, /level must be 1 or 2/);
  const tag = await post('/wake_up?tags=weights,gpu', {}, {}, server.url);
  assert.equal(tag.status, 400, tag.text);
  assert.match(tag.json.error.message, /unknown tag 'gpu'/);
  assert.equal(await isSleeping(), false);
  await complete();
});
