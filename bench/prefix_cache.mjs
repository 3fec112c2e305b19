// Prefix caching, measured against two servers of the same model: one caching, one started with
// --no-enable-prefix-caching. Prints figures; never fails on time.
//   1. Time to first token of a second chat turn over a shared history of HISTORY tokens (default 4000): the first
//      turn runs on both servers, then each turn-2 request (the history plus 200 new tokens, max_tokens 1) is timed,
//      REPEATS times with a fresh ending.
//   2. A multi-turn agent workload: CONVERSATIONS conversations (default 256) of TURNS turns (default 8) at once, each
//      turn appending 200 tokens to the conversation so far and generating 100; wall time and tokens/s, and the
//      caching server's hit rate from /metrics.
// Usage: node bench/prefix_cache.mjs CACHED_URL COLD_URL   (bench/prefix_cache.sh starts the servers)
const [cachedUrl, coldUrl] = process.argv.slice(2);
const model = process.env.MODEL ?? 'jambo-demo';
const historyTokens = Number(process.env.HISTORY ?? 4000);
const repeats = Number(process.env.REPEATS ?? 3);
const conversations = Number(process.env.CONVERSATIONS ?? 256);
const turns = Number(process.env.TURNS ?? 8);
const vocab = Number(process.env.VOCAB ?? 1000);

let seed = 12345;
const randomIds = (count) => Array.from({ length: count }, () => {
  seed = (seed * 1103515245 + 12345) % 2147483648;
  return seed % vocab;
});

async function complete(url, prompt, maxTokens) {
  const response = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model, prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true, return_token_ids: true }),
  });
  if (response.status !== 200) throw new Error(`HTTP ${response.status}: ${await response.text()}`);
  return (await response.json()).choices[0].token_ids;
}

async function metrics(url) {
  const values = {};
  for (const line of (await (await fetch(`${url}/metrics`)).text()).split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const space = line.lastIndexOf(' ');
    values[line.slice(0, space)] = Number(line.slice(space + 1));
  }
  return values;
}

async function timeToFirstToken() {
  const history = randomIds(historyTokens);
  for (const url of [cachedUrl, coldUrl]) await complete(url, history, 1);
  const times = { cached: [], cold: [] };
  for (let r = 0; r < repeats; ++r) {
    const turn2 = [...history, ...randomIds(200)];
    for (const [name, url] of [['cached', cachedUrl], ['cold', coldUrl]]) {
      const start = performance.now();
      await complete(url, turn2, 1);
      times[name].push(performance.now() - start);
    }
  }
  const best = (list) => Math.min(...list);
  console.log(`time to first token, turn 2 over a ${historyTokens}-token history + 200 new tokens (best of ${repeats}): ` +
    `cold ${best(times.cold).toFixed(1)} ms, cached ${best(times.cached).toFixed(1)} ms ` +
    `(${(best(times.cold) / best(times.cached)).toFixed(1)}x)`);
}

async function agentWorkload(url) {
  const before = await metrics(url);
  const start = performance.now();
  let generated = 0;
  let prompted = 0;
  await Promise.all(Array.from({ length: conversations }, async () => {
    let conversation = [];
    for (let t = 0; t < turns; ++t) {
      conversation = [...conversation, ...randomIds(200)];
      const ids = await complete(url, conversation, 100);
      prompted += conversation.length;
      generated += ids.length;
      conversation = [...conversation, ...ids];
    }
  }));
  const seconds = (performance.now() - start) / 1000;
  const after = await metrics(url);
  const hits = (after.jambo_prefix_cache_hits_total ?? 0) - (before.jambo_prefix_cache_hits_total ?? 0);
  const queries = (after.jambo_prefix_cache_queries_total ?? 0) - (before.jambo_prefix_cache_queries_total ?? 0);
  return { seconds, generated, prompted, hits, queries };
}

await timeToFirstToken();
for (const [name, url] of [['cold', coldUrl], ['cached', cachedUrl]]) {
  const r = await agentWorkload(url);
  const rate = r.queries > 0 ? `, ${(100 * r.hits / r.queries).toFixed(1)}% of prompt tokens from the cache` : '';
  console.log(`agent workload, ${name}: ${conversations} conversations x ${turns} turns (+200 tokens, 100 generated ` +
    `each): ${r.seconds.toFixed(1)} s, ${(r.generated / r.seconds).toFixed(0)} generated tok/s, ` +
    `${(r.prompted / r.seconds).toFixed(0)} prompt tok/s${rate}`);
}
