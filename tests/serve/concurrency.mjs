// 64 simultaneous streams (plus 8 clients that leave mid-stream) against kvplan serve under a
// plan, with --kv-mem too small for all of them at once: every answer equals `kvplan run` with
// the same prompt and plan, KV bytes in use (sampled from /metrics while they run, and the
// pool's peak) never exceed --kv-mem, requests queued for memory were admitted later, and
// after every client left nothing is held.
import fs from 'node:fs';
import OpenAI from 'openai';
import { startServer, runReference, metrics, kv, waitMetrics, check, textPath } from './lib.mjs';

const plan = process.env.KVPLAN_PLAN;
const planArgs = plan ? ['--plan', plan] : [];
const MODEL = 'stories260K';
const N = 64, LEAVERS = 8, MAX_TOKENS = 64;

// 16 distinct prompts: openings of TinyStories lines (each used by 4 streams)
const text = fs.readFileSync(textPath, 'utf8').split('\n').filter((l) => l.length > 80);
const prompts = text.slice(0, 16).map((l, i) => l.slice(0, 24 + 3 * i).trimEnd());
const refs = prompts.map((p) => runReference(p, MAX_TOKENS, planArgs));
check(refs.every((r) => r.length > 0), `${prompts.length} reference answers from kvplan run ${planArgs.join(' ')}`);

// --kv-mem: 24 requests' reservations (so 64 + 8 cannot all run at once)
const KV_MEM = Number(process.env.KVPLAN_KV_MEM || 600000);
const srv = await startServer(['--kv-mem', String(KV_MEM), '--max-queue', '512', '--quiet', ...planArgs]);
const client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
let maxInUse = 0, maxRunning = 0, samples = 0, polling = true;
const poller = (async () => {
  while (polling) {
    const m = await metrics(srv.base);
    maxInUse = Math.max(maxInUse, kv(m, 'in_use'));
    maxRunning = Math.max(maxRunning, m.kvplan_running_sequences);
    samples++;
    await new Promise((r) => setTimeout(r, 10));
  }
})();

try {
  const t0 = Date.now();
  let mainStops = 0; // answers of the 64 that ended on EOS (outcome "stop") rather than length
  const answers = Array.from({ length: N }, async (_, i) => {
    const s = await client.completions.create({
      model: MODEL, prompt: prompts[i % prompts.length], max_tokens: MAX_TOKENS, temperature: 0, stream: true,
    });
    let out = '';
    for await (const ch of s) {
      out += ch.choices[0]?.text ?? '';
      if (ch.choices[0]?.finish_reason === 'stop') mainStops++;
    }
    return out;
  });
  const leavers = Array.from({ length: LEAVERS }, async (_, i) => {
    const ac = new AbortController();
    const s = await client.completions.create({
      model: MODEL, prompt: prompts[i], max_tokens: 400, temperature: 1, seed: i, stream: true,
    }, { signal: ac.signal });
    let n = 0;
    try {
      for await (const ch of s) if (ch.choices.length && ++n === 2) ac.abort();
    } catch (err) {
      // the abort
    }
  });
  const got = await Promise.all(answers);
  await Promise.all(leavers);
  const secs = (Date.now() - t0) / 1000;
  const wrong = got.map((g, i) => [g, i]).filter(([g, i]) => g !== refs[i % prompts.length]);
  for (const [g, i] of wrong.slice(0, 3))
    console.log(`  stream ${i}: ${JSON.stringify(g)}\n  kvplan run: ${JSON.stringify(refs[i % prompts.length])}`);
  check(wrong.length === 0, `all ${N} streamed answers equal kvplan run (${secs.toFixed(1)} s)`);

  const m = await waitMetrics(srv.base, (x) => x.kvplan_running_sequences === 0 && x.kvplan_queued_requests === 0);
  polling = false;
  await poller;
  const cap = kv(m, 'capacity');
  check(cap === KV_MEM, `capacity on /metrics is --kv-mem (${cap})`);
  check(maxInUse > 0 && maxInUse <= cap && kv(m, 'peak') <= cap && kv(m, 'reserved_peak') <= cap,
    `KV bytes never above --kv-mem: sampled max ${maxInUse}, pool peak ${kv(m, 'peak')}, ` +
    `reserved peak ${kv(m, 'reserved_peak')} <= ${cap} (${samples} samples)`);
  check(m.kvplan_running_sequences_peak < N + LEAVERS && m.kvplan_admission_waits_total > 0,
    `admission by memory: at most ${m.kvplan_running_sequences_peak} at once, ` +
    `${m.kvplan_admission_waits_total} steps waited for bytes`);
  console.log(`    outcomes: ${JSON.stringify(Object.entries(m).filter(([k]) => k.startsWith("kvplan_requests_total")))}`);
  // a leaver whose sampled answer ends (EOS) in the step after its second token can finish
  // before the server notices that its client left: then it is a "stop", not a cancel
  const cancelled = m[`kvplan_requests_total{outcome="cancelled"}`];
  const leftStops = m[`kvplan_requests_total{outcome="stop"}`] - mainStops;
  check(cancelled >= LEAVERS / 2 && cancelled + leftStops === LEAVERS,
    `${cancelled} of the ${LEAVERS} clients that left were cancelled (${leftStops} answers ` +
    `ended on EOS before the server saw them leave)`);
  check(kv(m, 'in_use') === 0 && kv(m, 'reserved') === 0 && m.kvplan_running_sequences === 0,
    'nothing held after every client left');
  check(m.kvplan_time_to_first_token_seconds_count === N + LEAVERS, 'one time-to-first-token per request');
  // each fed token (a prompt has at least one) attends at least itself in every (layer, KV head):
  // 5 x 4 of them
  check(m.kvplan_steps_total > 0 &&
    m.kvplan_attention_entries_total >= 20 * m.kvplan_generated_tokens_total,
    `attention work on /metrics: ${m.kvplan_attention_entries_total} entries over ` +
    `${m.kvplan_steps_total} steps`);
} finally {
  polling = false;
  srv.proc.kill('SIGTERM');
}
const ex = await srv.exited;
check(ex.code === 0, `exit ${ex.code}`);
console.log('all passed');
