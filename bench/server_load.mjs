// Load benchmark of `jambo serve`: N concurrent streaming clients (plain fetch, server-sent events) for
// a fixed duration each; prints requests/s, generated tokens/s, time to first token and inter-token
// latency percentiles as a table. Usage: node bench/server_load.mjs URL [clients...]
// Environment: DURATION_S (per level, default 10), MAX_TOKENS (default 64), MODEL (default jambo-demo).
const [url, ...levels] = process.argv.slice(2);
const clients = levels.length ? levels.map(Number) : [1, 16, 64];
const durationMs = Number(process.env.DURATION_S ?? 10) * 1000;
const maxTokens = Number(process.env.MAX_TOKENS ?? 64);
const model = process.env.MODEL ?? 'jambo-demo';

const WORDS = 'the river old house music night garden winter city light people water story king road friend'.split(' ');
const prompt = (i) => Array.from({ length: 8 + (i % 24) }, (_, w) => WORDS[(i * 5 + w * 3) % WORDS.length]).join(' ');

// One streaming request: {ttft, gaps (between content chunks), tokens} in milliseconds.
async function one(i) {
  const start = performance.now();
  const response = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({
      model, prompt: prompt(i), max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true,
      stream_options: { include_usage: true },
    }),
  });
  if (response.status !== 200) throw new Error(`HTTP ${response.status}: ${await response.text()}`);
  const decoder = new TextDecoder();
  let buffer = '';
  let last = null;
  let ttft = null;
  const gaps = [];
  let tokens = 0;
  for await (const bytes of response.body) {
    buffer += decoder.decode(bytes, { stream: true });
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      if (!event.startsWith('data: ') || event === 'data: [DONE]') continue;
      const chunk = JSON.parse(event.slice(6));
      if (chunk.usage) tokens = chunk.usage.completion_tokens;
      if (!chunk.choices.length || chunk.choices[0].text === '') continue;
      const now = performance.now();
      if (ttft === null) ttft = now - start;
      else gaps.push(now - last);
      last = now;
    }
  }
  return { ttft, gaps, tokens };
}

function percentile(values, p) {
  if (!values.length) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

async function level(numClients) {
  const deadline = performance.now() + durationMs;
  const ttfts = [];
  const gaps = [];
  let requests = 0;
  let tokens = 0;
  let errors = 0;
  const started = performance.now();
  let next = 0;
  await Promise.all(Array.from({ length: numClients }, async () => {
    while (performance.now() < deadline) {
      try {
        const result = await one(next++);
        requests += 1;
        tokens += result.tokens;
        if (result.ttft !== null) ttfts.push(result.ttft);
        gaps.push(...result.gaps);
      } catch (error) {
        errors += 1;
        if (errors === 1) console.error(`clients ${numClients}: ${error.message}`);
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    }
  }));
  const seconds = (performance.now() - started) / 1000;
  return { numClients, requests, errors, seconds, reqPerS: requests / seconds, tokPerS: tokens / seconds,
    ttft: [50, 90, 99].map((p) => percentile(ttfts, p)), itl: [50, 90, 99].map((p) => percentile(gaps, p)) };
}

const rows = [];
for (const numClients of clients) rows.push(await level(numClients));
const ms = (value) => (Number.isNaN(value) ? '-' : value.toFixed(1));
console.log(`jambo serve load (${model}, ${maxTokens} tokens per request, ${durationMs / 1000} s per level, streaming)`);
console.log('clients  requests  errors   req/s   gen tok/s   TTFT p50/p90/p99 ms       ITL p50/p90/p99 ms');
for (const row of rows) {
  console.log(`${String(row.numClients).padStart(7)}  ${String(row.requests).padStart(8)}  ${String(row.errors).padStart(6)}` +
    `  ${row.reqPerS.toFixed(2).padStart(6)}  ${row.tokPerS.toFixed(1).padStart(10)}   ` +
    `${row.ttft.map(ms).join(' / ').padEnd(24)}  ${row.itl.map(ms).join(' / ')}`);
}
