// Long-context prompts for bench/serve.sh: N pieces of a text, piece k about T_k tokens long
// (T_k from LO to HI tokens, spread over the pieces), each followed by the max_tokens that
// fills the context up to at most MAXT new tokens, so that prompt + answer approaches the
// context. Token counts are the model's own (`kvplan tokenize`, BOS included).
// Usage: node bench/serve_prompts.mjs KVPLAN MODEL TEXT N LO HI CONTEXT MAXT > prompts.tsv
// Prints N lines "max_tokens<TAB>prompt" (the prompt on one line: the text's newlines become
// spaces). Exits 1 with a message when the text is too short or a piece cannot fit.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execFileSync } from 'node:child_process';

const [kvplan, model, textFile, nArg, loArg, hiArg, ctxArg, maxArg] = process.argv.slice(2);
const N = Number(nArg), LO = Number(loArg), HI = Number(hiArg), C = Number(ctxArg);
const MAXT = Number(maxArg);
const text = fs.readFileSync(textFile, 'utf8').replace(/\s+/g, ' ');
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kvplan-prompts-'));
const count = (s) => {
  const f = path.join(dir, 'piece.txt');
  fs.writeFileSync(f, s);
  return execFileSync(kvplan, ['tokenize', model, '--text', f]).toString().trim().split(/\s+/)
    .length;
};
let at = 0;
const out = [];
try {
  for (let k = 0; k < N; k++) {
    const want = LO + Math.round(((HI - LO) * ((k * 37) % N)) / Math.max(1, N - 1));
    let len = 2 * want, piece = '', n = 0;
    for (let tries = 0; tries < 8; tries++) { // chars per token ~2: converge on `want`
      piece = text.slice(at, at + len).replace(/ \S*$/, '').trim();
      n = count(piece);
      if (Math.abs(n - want) <= 4) break;
      len = Math.max(16, Math.round((len * want) / n));
    }
    if (at + len > text.length) throw new Error(`the text ends before piece ${k}`);
    const max = Math.min(MAXT, C - n);
    if (max < 1) throw new Error(`piece ${k} has ${n} tokens, the context ${C}`);
    out.push(`${max}\t${piece}`);
    at += piece.length + 1;
  }
} catch (e) {
  console.error(`bench/serve_prompts.mjs: ${e.message}; use a longer text or shorter prompts`);
  process.exit(1);
} finally {
  fs.rmSync(dir, { recursive: true, force: true });
}
console.log(out.join('\n'));
