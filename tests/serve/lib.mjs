// Helpers of the kvplan serve tests: start the server on a free port of 127.0.0.1, run
// `kvplan run` for reference answers, read /metrics.
import { spawn, execFileSync } from 'node:child_process';

export const kvplan = process.env.KVPLAN_BINARY;
// KVPLAN_SHARED (as the C suites) overrides the shared data directory ctest was configured with
const shared = process.env.KVPLAN_SHARED;
export const model = shared ? `${shared}/models/stories260K/stories260K.bin` : process.env.KVPLAN_MODEL;
export const textPath = shared ? `${shared}/text/tinystories_val_head.txt` : process.env.KVPLAN_TEXT;
if (!kvplan || !model) {
  console.error('set KVPLAN_BINARY and KVPLAN_MODEL (ctest does: tests/serve/README.md)');
  process.exit(2);
}

// Start `kvplan serve MODEL args...` on port 0 and wait for "listening on http://H:P".
export function startServer(args) {
  return new Promise((resolve, reject) => {
    const proc = spawn(kvplan, ['serve', model, '--port', '0', ...args], {
      stdio: ['ignore', 'inherit', 'pipe'],
    });
    let err = '';
    const timer = setTimeout(() => reject(new Error(`no "listening" line in 20 s:\n${err}`)), 20000);
    proc.stderr.on('data', (d) => {
      err += d.toString();
      const m = err.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m && !proc.port) {
        proc.port = Number(m[1]);
        clearTimeout(timer);
        resolve({
          proc,
          port: proc.port,
          base: `http://127.0.0.1:${proc.port}`,
          stderr: () => err,
          exited: new Promise((r) => proc.on('exit', (code, sig) => r({ code, sig }))),
        });
      }
    });
    proc.on('exit', (code) => {
      clearTimeout(timer);
      if (!proc.port) reject(new Error(`kvplan serve exited ${code}:\n${err}`));
    });
  });
}

// The text `kvplan run` generates after `prompt` (greedy), with the same budget options.
export function runReference(prompt, n, extra = []) {
  const out = execFileSync(
    kvplan,
    ['run', model, '--prompt', prompt, '-n', String(n), '--temperature', '0', '--quiet', ...extra],
    { encoding: 'utf8', env: { ...process.env, OPENBLAS_NUM_THREADS: '1' } },
  );
  if (!out.startsWith(prompt) || !out.endsWith('\n'))
    throw new Error(`kvplan run printed ${JSON.stringify(out)} for ${JSON.stringify(prompt)}`);
  return out.slice(prompt.length, -1);
}

// The /metrics samples as { 'name{labels}': value }.
export async function metrics(base) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const m = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    m[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return m;
}

export const kv = (m, kind) => m[`kvplan_kv_bytes{kind="${kind}"}`];

// Poll until cond(metrics) holds (at most ms), returning the last metrics.
export async function waitMetrics(base, cond, ms = 10000) {
  const t0 = Date.now();
  let m = await metrics(base);
  while (!cond(m) && Date.now() - t0 < ms) {
    await new Promise((r) => setTimeout(r, 50));
    m = await metrics(base);
  }
  return m;
}

export function check(ok, what) {
  if (!ok) throw new Error(`FAILED: ${what}`);
  console.log(`ok - ${what}`);
}

export function curl(args) {
  return execFileSync('curl', ['-s', '-S', '--max-time', '30', ...args], { encoding: 'utf8' });
}
