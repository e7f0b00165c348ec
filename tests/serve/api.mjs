// kvplan serve through the official OpenAI Node client and curl: completion and chat, streamed
// and not, stop strings, usage counts, every kind of bad request (400 / 401 / 404 / 405 / 413),
// a full queue (429), a client that leaves mid-stream (its blocks freed), an idle connection
// timed out, and SIGTERM (503 while draining, exit 0). Each answer is checked against
// `kvplan run` with the same prompt.
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, runReference, metrics, kv, waitMetrics, check, curl } from './lib.mjs';

const KEY = 'kvplan-test-key';
const srv = await startServer(['--kv-mem', '4Mi', '--api-key', KEY, '--timeout', '2', '--quiet']);
const client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: KEY, maxRetries: 0 });
const MODEL = 'stories260K';
const prompt = 'Once upon a time, there was a little dog';

try {
  // ---- models, completion, chat ----
  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === MODEL, 'GET /v1/models lists the model');
  const ref = runReference(prompt, 40);
  const c = await client.completions.create({ model: MODEL, prompt, max_tokens: 40, temperature: 0 });
  check(c.choices[0].text === ref, `completion equals kvplan run (${JSON.stringify(ref.slice(0, 40))}...)`);
  check(c.object === 'text_completion' && ['length', 'stop'].includes(c.choices[0].finish_reason),
    'completion object and finish_reason');
  check(c.usage.prompt_tokens > 5 && c.usage.completion_tokens <= 40 &&
    c.usage.total_tokens === c.usage.prompt_tokens + c.usage.completion_tokens, 'usage counts');

  const chat = await client.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: prompt }], max_tokens: 40, temperature: 0,
  });
  check(chat.choices[0].message.role === 'assistant' && chat.choices[0].message.content === ref,
    'chat (one user message = the plain-text template) equals kvplan run');

  // ---- streaming ----
  const stream = await client.completions.create({
    model: MODEL, prompt, max_tokens: 40, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '', chunks = 0, finish = null, usage = null;
  for await (const ch of stream) {
    if (ch.usage) usage = ch.usage;
    if (!ch.choices.length) continue;
    text += ch.choices[0].text;
    chunks++;
    if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  }
  check(text === ref && chunks > 10 && finish, `streamed completion (${chunks} chunks) equals kvplan run`);
  check(usage && usage.completion_tokens === c.usage.completion_tokens, 'streamed usage chunk');

  const cs = await client.chat.completions.create({
    model: MODEL, messages: [{ role: 'system', content: 'Once upon a time,' },
      { role: 'user', content: 'there was a little dog' }], max_tokens: 30, temperature: 0, stream: true,
  });
  let ctext = '', role = null;
  for await (const ch of cs) {
    if (ch.choices[0]?.delta?.role) role = ch.choices[0].delta.role;
    ctext += ch.choices[0]?.delta?.content ?? '';
  }
  check(role === 'assistant' && ctext === runReference('Once upon a time,\nthere was a little dog', 30),
    'streamed chat of two messages joined by "\\n" equals kvplan run');

  // ---- sampling: a seed reproduces, stop strings cut ----
  const s1 = await client.completions.create({ model: MODEL, prompt, max_tokens: 30, temperature: 0.9, seed: 5 });
  const s2 = await client.completions.create({ model: MODEL, prompt, max_tokens: 30, temperature: 0.9, seed: 5 });
  check(s1.choices[0].text === s2.choices[0].text, 'the same seed gives the same sampled text');
  const st = await client.completions.create({ model: MODEL, prompt, max_tokens: 40, temperature: 0, stop: ['.'] });
  check(st.choices[0].finish_reason === 'stop' && st.choices[0].text === ref.slice(0, ref.indexOf('.')),
    `stop ["."] cuts before the first "." (${JSON.stringify(st.choices[0].text)})`);

  // ---- bad requests: 400 with a message, the server unaffected ----
  const bad = [
    [{ model: 'gpt-4', prompt }, /does not exist/],
    [{ model: MODEL, prompt: 42 }, /prompt/],
    [{ model: MODEL, prompt, max_tokens: 'ten' }, /max_tokens/],
    [{ model: MODEL, prompt, max_tokens: 0 }, /max_tokens/],
    [{ model: MODEL, prompt, max_tokens: 100000 }, /max_tokens/],
    [{ model: MODEL, prompt: 'story '.repeat(600) }, /context/],
    [{ model: MODEL, prompt, temperature: -1 }, /temperature/],
    [{ model: MODEL, prompt, n: 2 }, /'n'/],
    [{ model: MODEL, prompt, stop: [1] }, /stop/],
  ];
  for (const [body, re] of bad) {
    let e = null;
    try {
      await client.completions.create(body);
    } catch (err) {
      e = err;
    }
    check(e && e.status === 400 && re.test(e.message) && e.error?.type === 'invalid_request_error',
      `400 for ${JSON.stringify(body).slice(0, 60)}: ${e?.message}`);
  }
  let e401 = null;
  try {
    await new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'wrong', maxRetries: 0 }).models.list();
  } catch (err) {
    e401 = err;
  }
  check(e401?.status === 401, 'a wrong API key gets 401');
  const auth = ['-H', `Authorization: Bearer ${KEY}`, '-H', 'Content-Type: application/json'];
  const code = (args) => curl(['-o', '/dev/null', '-w', '%{http_code}', ...args]);
  check(code([...auth, '-d', '{"model": "stories260K", "prompt": ', `${srv.base}/v1/completions`]) === '400',
    'curl: malformed JSON gets 400');
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvplan-serve-'));
  fs.writeFileSync(path.join(tmp, 'latin1.json'),
    Buffer.from('{"model":"stories260K","prompt":"caf\xe9 au lait"}', 'latin1'));
  check(code([...auth, '--data-binary', `@${tmp}/latin1.json`, `${srv.base}/v1/completions`]) === '400',
    'curl: a body that is not UTF-8 gets 400');
  fs.writeFileSync(path.join(tmp, 'big.json'), `{"model":"stories260K","prompt":"${'x'.repeat(2 << 20)}"}`);
  check(code([...auth, '--data-binary', `@${tmp}/big.json`, `${srv.base}/v1/completions`]) === '413',
    'curl: a 2 MiB body gets 413');
  fs.rmSync(tmp, { recursive: true });
  check(code([...auth, `${srv.base}/v1/nothing`]) === '404', 'curl: unknown path gets 404');
  check(code([...auth, `${srv.base}/v1/completions`]) === '405', 'curl: GET /v1/completions gets 405');
  check(code([`${srv.base}/health`]) === '200', 'curl: /health needs no key');
  const one = JSON.parse(curl([...auth, '-d',
    JSON.stringify({ model: MODEL, prompt, max_tokens: 40, temperature: 0 }), `${srv.base}/v1/completions`]));
  check(one.choices[0].text === ref, 'curl: the one-line completion equals kvplan run');

  // ---- a client that leaves mid-stream (while 12 others run, so that its answer takes a
  // while): cancelled, blocks freed ----
  const busy = Promise.all(Array.from({ length: 12 }, (_, i) => client.completions.create(
    { model: MODEL, prompt, max_tokens: 400, temperature: 1, seed: i })));
  const ac = new AbortController();
  const ls = await client.completions.create(
    { model: MODEL, prompt, max_tokens: 400, temperature: 0, stream: true }, { signal: ac.signal });
  let got = 0;
  try {
    for await (const ch of ls) {
      if (ch.choices.length && ++got === 3) ac.abort();
    }
  } catch (err) {
    // the abort
  }
  await busy;
  const m = await waitMetrics(srv.base, (x) => x['kvplan_requests_total{outcome="cancelled"}'] >= 1 &&
    x.kvplan_running_sequences === 0);
  console.log(`    ${m['kvplan_requests_total{outcome="cancelled"}']} cancelled, KV in use ${kv(m, 'in_use')}`);
  check(m['kvplan_requests_total{outcome="cancelled"}'] >= 1 && kv(m, 'in_use') === 0 &&
    kv(m, 'reserved') === 0, 'a client gone mid-stream: cancelled, KV bytes back to 0');

  // ---- an idle connection is closed after --timeout ----
  const closed = await new Promise((resolve) => {
    const sock = net.connect(srv.port, '127.0.0.1', () => sock.write('POST /v1/completions HTTP/1.1\r\n'));
    const t0 = Date.now();
    sock.on('close', () => resolve((Date.now() - t0) / 1000));
    sock.on('error', () => {});
    setTimeout(() => { sock.destroy(); resolve(-1); }, 8000);
  });
  check(closed > 1 && closed < 6, `an idle half-sent request is closed after ${closed.toFixed(1)} s`);

  const fin = await metrics(srv.base);
  check(fin['kvplan_http_responses_total{code="400"}'] >= bad.length + 1, '/metrics counts the 400s');
} finally {
  srv.proc.kill('SIGTERM');
}
const ex = await srv.exited;
check(ex.code === 0, `SIGTERM: exit ${ex.code}`);

// ---- a full queue answers 429; SIGTERM while busy: 503 for new requests, exit 0 ----
const q = await startServer(['--kv-mem', '330000', '--max-queue', '1', '--drain', '1', '--quiet']);
const qc = new OpenAI({ baseURL: `${q.base}/v1`, apiKey: 'none', maxRetries: 0 });
const many = await Promise.allSettled(Array.from({ length: 6 }, () =>
  qc.completions.create({ model: MODEL, prompt, max_tokens: 300, temperature: 0 })));
const r429 = many.filter((r) => r.status === 'rejected' && r.reason.status === 429);
check(r429.length >= 3 && r429[0].reason.error?.type === 'rate_limit_error',
  `${r429.length} of 6 at once get 429 (one KV slot, queue of 1)`);
q.proc.kill('SIGTERM');
check((await q.exited).code === 0, 'SIGTERM: exit 0');

// ---- SIGTERM while 24 streams run: new requests get 503, the streams end, exit 0 ----
const d = await startServer(['--kv-mem', '16Mi', '--drain', '5', '--quiet']);
const dc = new OpenAI({ baseURL: `${d.base}/v1`, apiKey: 'none', maxRetries: 0 });
const streams = Array.from({ length: 24 }, async (_, i) => {
  const s = await dc.completions.create(
    { model: MODEL, prompt, max_tokens: 480, temperature: 1, seed: 100 + i, stream: true });
  let n = 0;
  try {
    for await (const ch of s) n += ch.choices.length;
  } catch (err) {
    // cut at the drain deadline
  }
  return n;
});
await waitMetrics(d.base, (x) => x.kvplan_running_sequences >= 16);
d.proc.kill('SIGTERM');
await new Promise((r) => setTimeout(r, 100));
let e503 = null;
try {
  await dc.completions.create({ model: MODEL, prompt, max_tokens: 5 });
} catch (err) {
  e503 = err;
}
check(e503?.status === 503 && e503.error?.type === 'server_error',
  `a request while draining gets ${e503?.status ?? e503?.constructor.name}`);
const counts = await Promise.all(streams);
check(counts.every((n) => n > 0), 'every running stream got its tokens');
const de = await d.exited;
check(de.code === 0, `SIGTERM while busy: exit ${de.code}`);
console.log('all passed');
