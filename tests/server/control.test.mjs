// The control endpoints (POST /pause, /resume, /abort_requests, /update_weights_from_disk, /update_weights_from_ipc,
// /sleep, /wake_up; GET /is_paused, /is_sleeping): absent without --enable-control-endpoints; with --api-key every
// route but /health and /metrics, the OpenAI ones too, refused without the Bearer key; and, with it, pauses in the
// three modes and aborts by id over HTTP.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { BASE, MODEL, post, rawStream, sleep, startServer, waitIdle, withTimeout } from './lib.mjs';

const KEY = 'control-key-for-the-tests';
const AUTH = { Authorization: `Bearer ${KEY}` };
let server;
before(async () => {
  server = await startServer('control', ['--enable-control-endpoints', '--api-key', KEY]);
});
after(async () => {
  assert.equal(await server.stop(), 0, 'the server did not stop cleanly on SIGTERM');
});

const control = (method, path, body, headers = AUTH) =>
  method === 'GET'
    ? fetch(`${server.url}${path}`, { headers }).then(async (r) => ({ status: r.status, json: await r.json() }))
    : post(path, body ?? {}, headers, server.url);

const LONG = { model: MODEL, prompt: 'The river', max_tokens: 400, ignore_eos: true, temperature: 0 };
const SHORT = { model: MODEL, prompt: 'The meaning of life is', max_tokens: 12, ignore_eos: true, temperature: 0 };

// Waits until the server runs `count` requests.
async function running(count) {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const text = await (await fetch(`${server.url}/metrics`)).text();
    const value = Number(text.match(/^jambo_num_requests_running (\d+)/m)?.[1] ?? -1);
    if (value === count) return;
    if (Date.now() > deadline) throw new Error(`never ${count} running: ${value}`);
    await sleep(20);
  }
}

test('without --enable-control-endpoints the endpoints do not exist', async () => {
  for (const path of ['/pause', '/resume', '/abort_requests', '/update_weights_from_disk', '/update_weights_from_ipc',
                      '/sleep', '/wake_up'])
    assert.equal((await post(path, {}, AUTH, BASE)).status, 404, path);
  for (const path of ['/is_paused', '/is_sleeping'])
    assert.equal((await fetch(`${BASE}${path}`, { headers: AUTH })).status, 404, path);
});

test('without the Bearer key, or with another, every route but /health and /metrics answers 401', async () => {
  for (const headers of [{}, { Authorization: 'Bearer wrong' }, { Authorization: KEY }]) {
    for (const path of ['/pause', '/resume', '/abort_requests', '/update_weights_from_disk', '/update_weights_from_ipc',
                        '/sleep', '/wake_up', '/v1/completions', '/tokenize']) {
      const response = await control('POST', path, path === '/v1/completions' ? SHORT : {}, headers);
      assert.equal(response.status, 401, `${path} ${JSON.stringify(headers)}`);
      assert.equal(response.json.error.type, 'authentication_error');
    }
    for (const path of ['/is_paused', '/is_sleeping', '/v1/models'])
      assert.equal((await control('GET', path, undefined, headers)).status, 401, path);
    assert.equal((await fetch(`${server.url}/health`, { headers })).status, 200);
    assert.equal((await fetch(`${server.url}/metrics`, { headers })).status, 200);
  }
  assert.equal((await control('GET', '/is_paused')).json.is_paused, false, 'a 401 changed nothing');
  const bad = await control('POST', '/pause?mode=sleep');
  assert.equal(bad.status, 400);
  assert.equal(bad.json.error.param, 'mode');
});

test('keep freezes a running request and holds new ones; after resume both answer as if never paused', async () => {
  const reference = (await post('/v1/completions', LONG, AUTH, server.url)).json.choices[0].text;
  const frozen = post('/v1/completions', LONG, AUTH, server.url);
  await running(1);
  const paused = await control('POST', '/pause?mode=keep');
  assert.deepEqual([paused.status, paused.json], [200, { paused: true, mode: 'keep' }]);
  assert.equal((await control('GET', '/is_paused')).json.is_paused, true);
  let waitingDone = false;
  const waiting = post('/v1/completions', SHORT, AUTH, server.url).then((r) => ((waitingDone = true), r));
  await sleep(500);
  assert.equal(waitingDone, false, 'a request sent while paused was answered before resume');
  assert.deepEqual((await control('POST', '/resume')).json, { paused: false });
  const [first, second] = await withTimeout(Promise.all([frozen, waiting]), 60_000, 'the requests after resume');
  assert.equal(first.json.choices[0].finish_reason, 'length');
  assert.equal(first.json.choices[0].text, reference, 'the frozen request continued differently');
  assert.equal(second.status, 200);
  assert.equal(second.json.usage.completion_tokens, 12);
  await waitIdle(server.url);
});

test('abort ends a running request with finish_reason "abort" and its text so far; wait lets it finish', async () => {
  const aborted = post('/v1/completions', LONG, AUTH, server.url);
  await running(1);
  assert.equal((await control('POST', '/pause?mode=abort')).status, 200);
  const answer = await aborted;
  assert.equal(answer.status, 200);
  assert.equal(answer.json.choices[0].finish_reason, 'abort');
  assert.ok(answer.json.usage.completion_tokens < 400);
  await control('POST', '/resume');

  // Long enough to be seen running (12 tokens of the demo can end between two polls of /metrics).
  const finishing = post('/v1/completions', LONG, AUTH, server.url);
  await running(1);
  const paused = await control('POST', '/pause?mode=wait');
  assert.deepEqual(paused.json, { paused: true, mode: 'wait' });
  const finished = await finishing;  // answered before, or as, the pause held
  assert.equal(finished.json.choices[0].finish_reason, 'length');
  await control('POST', '/resume');
  await waitIdle(server.url);
});

// A stream's text, its chunks put together, and the finish reason of its last chunk.
function streamed({ events, done }) {
  assert.ok(done, 'the stream did not end with [DONE]');
  const chunks = events.slice(0, -1).map((event) => JSON.parse(event).choices[0]).filter(Boolean);
  return { text: chunks.map((c) => c.text).join(''), finish: chunks.at(-1).finish_reason };
}

test('with streams in flight: keep freezes and resumes a stream unchanged, abort ends it, wait lets it finish', async () => {
  const reference = (await post('/v1/completions', LONG, AUTH, server.url)).json.choices[0].text;
  const kept = rawStream('/v1/completions', LONG, server.url, AUTH);
  await running(1);
  assert.equal((await control('POST', '/pause?mode=keep')).status, 200);
  await sleep(300);
  await control('POST', '/resume');
  assert.deepEqual(streamed(await withTimeout(kept, 60_000, 'the kept stream')), { text: reference, finish: 'length' });

  const aborted = rawStream('/v1/completions', LONG, server.url, AUTH);
  await running(1);
  assert.equal((await control('POST', '/pause?mode=abort')).status, 200);
  const cut = streamed(await aborted);
  assert.equal(cut.finish, 'abort');
  assert.ok(reference.startsWith(cut.text) && cut.text.length < reference.length, 'the aborted stream is not a prefix');
  await control('POST', '/resume');

  const finishing = rawStream('/v1/completions', LONG, server.url, AUTH);
  await running(1);
  assert.equal((await control('POST', '/pause?mode=wait')).status, 200);
  assert.equal(streamed(await finishing).finish, 'length');
  await control('POST', '/resume');
  await waitIdle(server.url);
});

test('/abort_requests ends the requests named by X-Request-Id or response id, and says which it found', async () => {
  const victim = post('/v1/completions', LONG, { ...AUTH, 'X-Request-Id': 'victim-1' }, server.url);
  await running(1);
  const result = await control('POST', '/abort_requests', { request_ids: ['victim-1', 'nobody'] });
  assert.deepEqual([result.status, result.json], [200, { aborted: ['victim-1'], not_found: ['nobody'] }]);
  const answer = await victim;
  assert.equal(answer.json.choices[0].finish_reason, 'abort');
  assert.match(answer.json.id, /^cmpl-victim-1-/);
  const malformed = await control('POST', '/abort_requests', { request_ids: 'victim-1' });
  assert.equal(malformed.status, 400);
  assert.equal(malformed.json.error.param, 'request_ids');
  await waitIdle(server.url);
});
