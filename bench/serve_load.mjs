// Load generator for kvplan serve (bench/serve.sh): C workers, each streaming completions one
// after another for D seconds (Node's fetch, no packages), then the server's /metrics.
// Usage: node bench/serve_load.mjs BASE_URL CONCURRENCY SECONDS MAX_TOKENS PROMPTS_FILE [WARMUP]
// PROMPTS_FILE: one prompt per line, or "max_tokens<TAB>prompt" lines (bench/serve_prompts.mjs)
// whose own max_tokens replaces MAX_TOKENS. WARMUP (seconds, default 0): the clients run that
// long before the measured window of SECONDS, so that the window sees the steady state (the
// first requests' prompts all prefilled at once are not counted).
// Prints one JSON line, over the window: generated tokens/s, p50/p99 time to first token (ms,
// client side, queueing included; the first tokens received in the window, whenever their
// request was sent), p50/p99 inter-token latency
// (ms, the server's histogram over the window: a client reads several events at once),
// requests completed, the server's prompt tokens prefilled per second, and the server's peaks.
import fs from 'node:fs';

const [base, conc, secs, maxTokens, promptsFile, warmup] = process.argv.slice(2);
const C = Number(conc), D = Number(secs) * 1000, MAXT = Number(maxTokens);
const W = Number(warmup || 0) * 1000;
const prompts = fs.readFileSync(promptsFile, 'utf8').split('\n').filter((l) => l.length > 0)
  .map((l) => {
    const m = l.match(/^(\d+)\t(.*)$/);
    return m ? { max: Number(m[1]), text: m[2] } : { max: MAXT, text: l };
  });
const ttft = [], itl = [];
let tokens = 0, done = 0, failed = 0;
const t0 = performance.now() + W, end = t0 + D; /* the measured window [t0, end] */

async function one(worker, k) {
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(), Math.max(0, end - performance.now()));
  const start = performance.now();
  let last = 0;
  try {
    const res = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({
        model: 'stories260K', prompt: prompts[(worker * 7 + k) % prompts.length].text,
        max_tokens: prompts[(worker * 7 + k) % prompts.length].max, temperature: 0.8,
        seed: worker * 1000 + k, stream: true,
      }),
      signal: ac.signal,
    });
    if (res.status !== 200) {
      failed++;
      await res.text();
      return;
    }
    const dec = new TextDecoder();
    let buf = '';
    for await (const part of res.body) {
      buf += dec.decode(part, { stream: true });
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, i);
        buf = buf.slice(i + 2);
        if (!ev.startsWith('data: {')) continue;
        const ch = JSON.parse(ev.slice(6));
        if (!ch.choices.length || ch.choices[0].finish_reason) continue;
        const now = performance.now();
        if (now > end) continue;
        if (now >= t0) {
          if (last === 0) ttft.push(now - start);
          else if (last !== 0) itl.push(now - last);
          tokens++;
        }
        last = now;
      }
    }
    if (performance.now() <= end && performance.now() >= t0) done++;
  } catch (err) {
    if (err.name !== 'AbortError') failed++;
  } finally {
    clearTimeout(timer);
  }
}

async function worker(w) {
  for (let k = 0; performance.now() < end; k++) await one(w, k);
}

const metricsText = async () => (await fetch(`${base}/metrics`)).text();
// the server's counters as the window opens (after the warm-up), to subtract
let before = '';
const snap = new Promise((resolve) => setTimeout(async () => {
  before = await metricsText();
  resolve();
}, Math.max(0, t0 - performance.now())));
await Promise.all(Array.from({ length: C }, (_, w) => worker(w)));
await snap;
const q = (a, p) => {
  if (!a.length) return null;
  const s = [...a].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))];
};
const text = await metricsText();
const metricIn = (t, name) => {
  const m = t.match(new RegExp(`^${name.replace(/[{}"]/g, (c) => `\\${c}`)} (\\S+)$`, 'm'));
  return m ? Number(m[1]) : null;
};
const metric = (name) => metricIn(text, name);
// a quantile of a /metrics histogram, interpolated within its bucket (as Prometheus's
// histogram_quantile), in ms
const buckets = (t, name) => [...t.matchAll(new RegExp(`^${name}_bucket\\{le="([^"]+)"\\} (\\S+)$`, 'gm'))]
  .map((m) => [m[1] === '+Inf' ? Infinity : Number(m[1]), Number(m[2])]);
const hq = (name, p) => {
  const b0 = buckets(before, name);
  const b = buckets(text, name).map(([le, cum], i) => [le, cum - (b0[i] ? b0[i][1] : 0)]);
  const total = b.length ? b[b.length - 1][1] : 0;
  if (!total) return null;
  let lo = 0, below = 0;
  for (const [le, cum] of b) {
    if (cum >= p * total) {
      if (le === Infinity) return lo * 1000;
      return (lo + (le - lo) * ((p * total - below) / Math.max(1, cum - below))) * 1000;
    }
    lo = le;
    below = cum;
  }
  return null;
};
console.log(JSON.stringify({
  concurrency: C,
  seconds: D / 1000,
  tokens,
  tokens_per_s: tokens / (D / 1000),
  requests_done: done,
  failed,
  ttft_p50_ms: q(ttft, 0.5),
  ttft_p99_ms: q(ttft, 0.99),
  itl_p50_ms: hq('kvplan_inter_token_latency_seconds', 0.5),
  itl_p99_ms: hq('kvplan_inter_token_latency_seconds', 0.99),
  itl_client_mean_ms: itl.length ? itl.reduce((a, x) => a + x, 0) / itl.length : null,
  warmup_s: W / 1000,
  prompt_tokens_per_s: (metric('kvplan_prompt_tokens_total') -
    (metricIn(before, 'kvplan_prompt_tokens_total') || 0)) / (D / 1000),
  // attention work per generated token over the window: (query row, KV head, entry) triples
  attended_per_token: (() => {
    const g = metric('kvplan_generated_tokens_total') - (metricIn(before, 'kvplan_generated_tokens_total') || 0);
    const a = metric('kvplan_attention_entries_total') - (metricIn(before, 'kvplan_attention_entries_total') || 0);
    return g > 0 ? a / g : null;
  })(),
  peak_running: metric('kvplan_running_sequences_peak'),
  kv_peak: metric('kvplan_kv_bytes{kind="peak"}'),
  kv_reserved_peak: metric('kvplan_kv_bytes{kind="reserved_peak"}'),
  kv_capacity: metric('kvplan_kv_bytes{kind="capacity"}'),
}));
