// Shared helpers of the end-to-end server tests: the openai client, extra servers, metrics, SSE, weight folders.
// tests/server/server_test.sh sets JAMBO_URL (the shared server), JAMBO_BIN, JAMBO_MODEL and JAMBO_WORK.
import { spawn } from 'node:child_process';
import { closeSync, createWriteStream, mkdirSync, openSync, readFileSync, readSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { join } from 'node:path';
import OpenAI from 'openai';

export const BASE = process.env.JAMBO_URL ?? 'http://127.0.0.1:8000';
export const JAMBO_BIN = process.env.JAMBO_BIN ?? 'build/jambo';
export const MODEL_DIR = process.env.JAMBO_MODEL ?? 'models/jambo-demo';
export const WORK = process.env.JAMBO_WORK ?? '/tmp';
export const MODEL = 'jambo-demo';

// A real client: no retries (a 429 must surface), a bound on every request.
export function client(base = BASE, options = {}) {
  return new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000, ...options });
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Rejects after ms with a message naming what timed out; the timer never keeps node alive.
export function withTimeout(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: timed out after ${ms} ms`)), ms);
    timer.unref();
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

// Starts `jambo serve` on a free port with extra flags; its output goes to $JAMBO_WORK/<name>.log,
// which tests/server/server_test.sh prints when anything fails.
export async function startServer(name, flags = []) {
  const logPath = join(WORK, `${name}.log`);
  const log = createWriteStream(logPath);
  const child = spawn(JAMBO_BIN, ['serve', '--model', MODEL_DIR, '--port', '0', ...flags], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { OMP_WAIT_POLICY: 'PASSIVE', ...process.env },
  });
  child.stderr.pipe(log);
  let stdout = '';
  const url = await withTimeout(
    new Promise((resolve, reject) => {
      child.stdout.on('data', (data) => {
        log.write(data);
        stdout += data;
        const match = stdout.match(/jambo: serving \S+ on (http:\/\/[0-9.]+:\d+) /);
        if (match) resolve(match[1]);
      });
      child.on('exit', (code) => reject(new Error(`${name} server exited with ${code} before listening (${logPath})`)));
    }),
    30_000,
    `${name} server start`,
  );
  const exited = new Promise((resolve) => child.on('exit', resolve));
  return {
    url,
    logPath,
    pid: child.pid,
    signal: (name) => child.kill(name),
    // SIGTERM; past timeoutMs, SIGKILL and throw.
    async stop(timeoutMs = 10_000) {
      if (child.exitCode === null) child.kill('SIGTERM');
      const code = await withTimeout(exited, timeoutMs, `${name} server stop on SIGTERM`).catch((error) => {
        child.kill('SIGKILL');
        throw error;
      });
      log.end();
      return code;
    },
  };
}

// A process's resident memory from /proc: {rss, peak} in bytes (VmRSS, VmHWM).
export function memory(pid) {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kib = (name) => Number(status.match(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm'))[1]) * 1024;
  return { rss: kib('VmRSS'), peak: kib('VmHWM') };
}

// Raw bytes on a connection of its own: `send(socket)` writes them (it may write for long, errors once the server
// closed are expected); resolves once the server closes or after timeoutMs with {text, status, closed, ms}, status
// that of the first response (0: none).
export function rawExchange(base, send, timeoutMs = 30_000) {
  const { hostname, port } = new URL(base);
  const started = performance.now();
  return new Promise((resolve) => {
    const socket = net.connect({ host: hostname, port: Number(port) });
    const chunks = [];
    let done = false;
    const finish = (closed) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      socket.destroy();
      const text = Buffer.concat(chunks).toString('latin1');
      const status = Number(text.match(/^HTTP\/1\.[01] (\d{3})/)?.[1] ?? 0);
      resolve({ text, status, closed, ms: performance.now() - started });
    };
    const timer = setTimeout(() => finish(false), timeoutMs);
    socket.on('data', (data) => chunks.push(data));
    socket.on('end', () => finish(true));
    socket.on('close', () => finish(true));
    socket.on('error', () => {});  // a reset after the answer, while the client still writes
    socket.on('connect', () => send(socket));
  });
}

// GET /metrics as {name or name{labels}: number}.
export async function metrics(base = BASE) {
  const response = await fetch(`${base}/metrics`);
  if (response.status !== 200) throw new Error(`/metrics answered ${response.status}`);
  const values = {};
  for (const line of (await response.text()).split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const space = line.lastIndexOf(' ');
    values[line.slice(0, space)] = Number(line.slice(space + 1));
  }
  return values;
}

const IDLE_GAUGES = ['jambo_state_slots_used', 'jambo_kv_blocks_used', 'jambo_num_requests_running',
  'jambo_num_requests_waiting'];

// Polls /metrics until no slot, block or request is held; throws with the last values after ms.
export async function waitIdle(base = BASE, ms = 2000) {
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    last = await metrics(base);
    if (IDLE_GAUGES.every((name) => last[name] === 0)) return last;
    if (Date.now() > deadline) {
      const held = IDLE_GAUGES.map((name) => `${name}=${last[name]}`).join(' ');
      throw new Error(`the server is not idle ${ms} ms later: ${held}`);
    }
    await sleep(50);
  }
}

// POST with a raw body (a string or bytes, sent as they are) or an object sent as JSON; returns {status, headers, json, text}.
export async function post(path, body, headers = {}, base = BASE) {
  const response = await fetch(`${base}${path}`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body),
  });
  const text = await response.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: response.status, headers: response.headers, json, text };
}

// A streaming request read as raw server-sent events: {status, events: [data strings], done}.
export async function rawStream(path, body, base = BASE, headers = {}) {
  const response = await post(path, { ...body, stream: true }, headers, base);
  const events = response.text
    .split('\n\n')
    .filter((block) => block.startsWith('data: '))
    .map((block) => block.slice('data: '.length));
  return { ...response, events, done: events.at(-1) === '[DONE]' };
}

// Reads an openai completions stream into per-choice text, tokens and logprobs.
export async function collectCompletion(stream) {
  const choices = [];
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks += 1;
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      const into = (choices[choice.index] ??= { text: '', tokens: [], token_logprobs: [], finish_reason: null });
      into.text += choice.text;
      if (choice.logprobs) {
        into.tokens.push(...choice.logprobs.tokens);
        into.token_logprobs.push(...choice.logprobs.token_logprobs);
      }
      if (choice.finish_reason) into.finish_reason = choice.finish_reason;
    }
  }
  return { choices, usage, chunks };
}

// Reads an openai chat stream into per-choice content and logprobs.
export async function collectChat(stream) {
  const choices = [];
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      const into = (choices[choice.index] ??= { content: '', role: null, logprobs: [], finish_reason: null });
      if (choice.delta.role) into.role = choice.delta.role;
      into.content += choice.delta.content ?? '';
      if (choice.logprobs?.content) into.logprobs.push(...choice.logprobs.content);
      if (choice.finish_reason) into.finish_reason = choice.finish_reason;
    }
  }
  return { choices, usage };
}

// Distinct prompts of 1 to ~60 words, so that arrivals need chunked prefill next to decodes.
const WORDS = ('the river old house music night garden winter city light people water story king road ' +
  'friend morning window letter mountain dream book world time money love computer program island').split(' ');
export function prompts(count) {
  return Array.from({ length: count }, (_, i) => {
    const length = 1 + ((i * 13) % 60);
    const words = Array.from({ length }, (_, w) => WORDS[(i * 7 + w * (i % 5 + 1)) % WORDS.length]);
    return `${i}: ${words.join(' ')}`;
  });
}

// The demo checkpoint's safetensors header: {name: {dtype, shape, data_offsets}}.
export function demoHeader() {
  const fd = openSync(join(MODEL_DIR, 'model.safetensors'), 'r');
  const length = Buffer.alloc(8);
  readSync(fd, length, 0, 8, 0);
  const header = Buffer.alloc(Number(length.readBigUInt64LE()));
  readSync(fd, header, 0, header.length, 8);
  closeSync(fd);
  return JSON.parse(header.toString('utf8'));
}

// folder/model.safetensors holding one tensor, every value `value` (F32 or BF16).
export function writeOneTensor(folder, name, dtype, shape, value) {
  const count = shape.reduce((a, b) => a * b, 1);
  const data = Buffer.alloc(count * (dtype === 'F32' ? 4 : 2));
  const word = Buffer.alloc(4);
  word.writeFloatLE(value);
  for (let i = 0; i < count; ++i)
    if (dtype === 'F32') word.copy(data, 4 * i);
    else word.copy(data, 2 * i, 2, 4);  // bf16: the high half of the float
  const header = Buffer.from(JSON.stringify({ [name]: { dtype, shape, data_offsets: [0, data.length] } }));
  const length = Buffer.alloc(8);
  length.writeBigUInt64LE(BigInt(header.length));
  mkdirSync(folder, { recursive: true });
  writeFileSync(join(folder, 'model.safetensors'), Buffer.concat([length, header, data]));
}
