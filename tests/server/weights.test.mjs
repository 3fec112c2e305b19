// POST /update_weights_from_disk and GET /weight_version on a running server: a folder of one tensor changes what
// the engine computes and names the weights in every output; a bad folder (a wrong shape, an unknown name, a wrong
// dtype, a truncated file) answers 400 naming the tensor or the file and the old weights serve on bit for bit;
// folders outside --allowed-weight-paths are refused (403); the demo checkpoint put back gives back the first
// logprobs exactly. Absent without --enable-control-endpoints.
import assert from 'node:assert/strict';
import { mkdirSync, statSync, symlinkSync, truncateSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { after, before, test } from 'node:test';
import { BASE, MODEL, MODEL_DIR, WORK, demoHeader, post, startServer, writeOneTensor } from './lib.mjs';

const ROOT = join(WORK, 'weights');  // the one folder the server may read weights from
const NORM = 'model.final_layernorm.weight';
let server;

before(async () => {
  const norm = demoHeader()[NORM];
  writeOneTensor(join(ROOT, 'norm-2'), NORM, norm.dtype, norm.shape, 2.0);
  writeOneTensor(join(ROOT, 'misshapen'), NORM, norm.dtype, [norm.shape[0] + 1], 1.0);
  writeOneTensor(join(ROOT, 'unknown'), 'model.layers.0.no_such.weight', norm.dtype, norm.shape, 1.0);
  writeOneTensor(join(ROOT, 'wrong-dtype'), NORM, norm.dtype === 'F32' ? 'BF16' : 'F32', norm.shape, 1.0);
  writeOneTensor(join(ROOT, 'truncated'), NORM, norm.dtype, norm.shape, 1.0);
  const file = join(ROOT, 'truncated', 'model.safetensors');
  truncateSync(file, statSync(file).size - 2);
  mkdirSync(join(ROOT, 'demo'), { recursive: true });
  symlinkSync(resolve(MODEL_DIR, 'model.safetensors'), join(ROOT, 'demo', 'model.safetensors'));
  server = await startServer('weights', ['--enable-control-endpoints', '--allowed-weight-paths', ROOT]);
});
after(async () => {
  assert.equal(await server.stop(), 0, 'the server did not stop cleanly on SIGTERM');
});

const update = (body) => post('/update_weights_from_disk', body, {}, server.url);
const version = async () => (await (await fetch(`${server.url}/weight_version`)).json()).weight_version;
const GREEDY = { model: MODEL, prompt: 'The meaning of life is', max_tokens: 8, temperature: 0, logprobs: 1, ignore_eos: true };
async function complete() {
  const response = await post('/v1/completions', GREEDY, {}, server.url);
  assert.equal(response.status, 200, response.text);
  const [choice] = response.json.choices;
  return { text: choice.text, logprobs: choice.logprobs.token_logprobs, versions: choice.weight_versions };
}

test('without --enable-control-endpoints there is no /update_weights_from_disk', async () => {
  assert.equal((await post('/update_weights_from_disk', { model_path: ROOT }, {}, BASE)).status, 404);
});

test('an update changes the weights, a bad one changes nothing, and the old checkpoint gives the old logprobs back', async () => {
  const first = await complete();
  assert.deepEqual(first.versions, [{ version: 'default', start: 0, end: 8 }]);

  for (const [folder, message] of [['misshapen', `tensor '${NORM}' has shape`],
                                   ['unknown', "tensor 'model.layers.0.no_such.weight' is not one the model reads"],
                                   ['wrong-dtype', `tensor '${NORM}' is`], ['truncated', 'model.safetensors']]) {
    const refused = await update({ model_path: join(ROOT, folder), weight_version: 'never' });
    assert.equal(refused.status, 400, `${folder}: ${refused.text}`);
    assert.match(refused.json.error.message, new RegExp(message), folder);
    assert.equal(await version(), 'default');
    assert.deepEqual(await complete(), first, `a refused update (${folder}) changed what the server computes`);
  }

  const norm = await update({ model_path: join(ROOT, 'norm-2'), weight_version: 'norm-2' });
  assert.equal(norm.status, 200, norm.text);
  assert.equal(norm.json.success, true);
  assert.equal(norm.json.num_weights, 1);
  assert.equal(norm.json.weight_version, 'norm-2');
  assert.equal(await version(), 'norm-2');
  const changed = await complete();
  assert.deepEqual(changed.versions, [{ version: 'norm-2', start: 0, end: 8 }]);
  assert.notDeepEqual(changed.logprobs, first.logprobs, 'the new final norm did not change the logprobs');

  const restored = await update({ model_path: join(ROOT, 'demo'), weight_version: 'restored' });
  assert.equal(restored.status, 200, restored.text);
  const again = await complete();
  assert.deepEqual(again.versions, [{ version: 'restored', start: 0, end: 8 }]);
  assert.deepEqual([again.text, again.logprobs], [first.text, first.logprobs]);
});

test('folders outside --allowed-weight-paths are refused with 403, malformed bodies with 400', async () => {
  for (const path of [MODEL_DIR, join(ROOT, '..'), join(ROOT, 'demo', '..', '..')]) {
    const response = await update({ model_path: path });
    assert.equal(response.status, 403, `${path}: ${response.text}`);
    assert.equal(response.json.error.type, 'permission_error');
  }
  for (const body of [{}, { model_path: 3 }, { model_path: join(ROOT, 'demo'), weight_version: '' }]) {
    const response = await update(body);
    assert.equal(response.status, 400, `${JSON.stringify(body)}: ${response.text}`);
  }
  const missing = await update({ model_path: join(ROOT, 'missing') });
  assert.equal(missing.status, 400, missing.text);
  assert.match(missing.json.error.message, /missing/);
});

// /update_weights_from_ipc is read here and checked field by field; the CPU backend then refuses tensors in GPU
// memory (tools/ipc_update_check.py runs the CUDA backend's on the GPU machine).
test('update_weights_from_ipc: malformed entries answer 400 naming the field; the CPU backend refuses GPU memory', async () => {
  assert.equal((await post('/update_weights_from_ipc', { tensors: [] }, {}, BASE)).status, 404);
  const handle = Buffer.alloc(64, 7).toString('base64');
  const entry = { name: NORM, dtype: 'F32', shape: [64], ipc_handle: handle, offset: 0 };
  const cases = [
    [{}, 'tensors'],
    [{ tensors: [] }, 'tensors'],
    [{ tensors: [3] }, 'tensors[0]'],
    [{ tensors: [{ ...entry, name: 5 }] }, 'tensors[0].name'],
    [{ tensors: [{ ...entry, dtype: 'F8' }] }, 'tensors[0].dtype'],
    [{ tensors: [{ ...entry, shape: [-1] }] }, 'tensors[0].shape'],
    [{ tensors: [{ ...entry, shape: [1 << 30, 1 << 30, 1 << 30] }] }, 'tensors[0].shape'],
    [{ tensors: [{ ...entry, ipc_handle: 'not base64!' }] }, 'tensors[0].ipc_handle'],
    [{ tensors: [{ ...entry, ipc_handle: Buffer.alloc(63).toString('base64') }] }, 'tensors[0].ipc_handle'],
    [{ tensors: [entry, { ...entry, offset: -8 }] }, 'tensors[1].offset'],
    [{ tensors: [entry], weight_version: '' }, 'weight_version'],
  ];
  for (const [body, field] of cases) {
    const response = await post('/update_weights_from_ipc', body, {}, server.url);
    assert.equal(response.status, 400, `${JSON.stringify(body)}: ${response.text}`);
    assert.equal(response.json.error.param, field, response.text);
  }
  const before = await complete();
  const cpu = await post('/update_weights_from_ipc', { tensors: [entry], weight_version: 'ipc' }, {}, server.url);
  assert.equal(cpu.status, 400, cpu.text);
  assert.match(cpu.json.error.message, /CPU backend cannot read tensors in GPU memory/);
  assert.notEqual(await version(), 'ipc');
  assert.deepEqual(await complete(), before);
});
