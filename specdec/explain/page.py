"""The explain page: one HTML file, no network (inline CSS and JavaScript, the run as JSON inside).

The JSON escapes every "/" as "\\/" and the "h" of every "http" as "\\u0068" (both valid JSON), so
neither "</script>" nor anything that looks like a link can appear in the page from the run's own
text; token texts are inserted with textContent, never as HTML.
"""

from __future__ import annotations

import html
import json
import re

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0; background: #fafafa; color: #1d1d1f; }
header { padding: 12px 20px; background: #20232a; color: #fff; }
header h1 { font-size: 18px; margin: 0 0 4px; }
header .meta { font-size: 12px; color: #c9cdd4; }
main { display: grid; grid-template-columns: minmax(0, 1.2fr) minmax(0, 1fr); gap: 16px; padding: 16px 20px; }
section { background: #fff; border: 1px solid #e3e3e6; border-radius: 8px; padding: 12px 14px; }
h2 { font-size: 15px; margin: 0 0 8px; }
#controls { grid-column: 1 / -1; display: flex; align-items: center; gap: 12px; }
button { font: inherit; padding: 4px 12px; border-radius: 6px; border: 1px solid #b8b8c0; background: #fff; cursor: pointer; }
button:disabled { opacity: .4; cursor: default; }
#round-counter { font-weight: 600; min-width: 130px; }
.hint { color: #6b6b75; font-size: 12px; }
#text { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 13px; max-height: 460px; overflow: auto; }
.prompt { color: #8a8a94; }
.out.accepted { background: #d4f5d4; }
.out.corrected { background: #ffe7a3; }
.out.bonus { background: #c9ecf7; }
.out.current { outline: 2px solid #5b6cff; outline-offset: -1px; }
.ghost { text-decoration: line-through; color: #c0392b; opacity: .8; }
.ghost.discarded { color: #9a9aa3; }
.legend span { padding: 0 6px; margin-right: 6px; border-radius: 3px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: right; padding: 3px 6px; border-bottom: 1px solid #eee; }
th:first-child, td:first-child, td.tok { text-align: left; }
tr.pos { cursor: pointer; }
tr.focus { background: #eef0ff; }
td.tok { font-family: ui-monospace, monospace; white-space: pre; }
.v-accepted { color: #1e8e3e; } .v-rejected { color: #c0392b; } .v-discarded { color: #9a9aa3; }
.bars .row { display: grid; grid-template-columns: 120px 1fr 60px; gap: 6px; align-items: center; margin: 2px 0; }
.bars .label { font-family: ui-monospace, monospace; overflow: hidden; white-space: pre; text-overflow: ellipsis; }
.bar { height: 8px; border-radius: 2px; }
.bar.p { background: #3867d6; } .bar.q { background: #f39c12; margin-top: 2px; } .bar.r { background: #8e44ad; }
.bars .chosen .label { font-weight: 700; }
#summary { grid-column: 1 / -1; }
#worked li { margin: 2px 0; }
.reason { color: #55555f; font-size: 12px; margin: 4px 0 8px; }
#tree .node { font-family: ui-monospace, monospace; white-space: pre; color: #9a9aa3; }
#tree .node.on-path { color: #1e8e3e; font-weight: 700; }
"""

SCRIPT = r"""
const data = JSON.parse(document.getElementById('run-data').textContent);
const rounds = data.rounds;
let current = 0, focus = null;
const $ = (id) => document.getElementById(id);
const el = (tag, attrs, text) => { const e = document.createElement(tag); Object.assign(e, attrs || {});
  if (text !== undefined) e.textContent = text; return e; };
const fmt = (x, d) => (x === null || x === undefined) ? '–' : Number(x).toFixed(d === undefined ? 3 : d);
const show = (t) => JSON.stringify(t).slice(1, -1);

function renderText() {
  const box = $('text'); box.textContent = '';
  box.appendChild(el('span', {className: 'prompt'}, data.prompt_text));
  for (let i = 0; i <= current; i++) {
    const r = rounds[i], kinds = r.kinds;
    r.texts.forEach((t, j) => {
      if (i === current && j === r.accepted) {  // the drafts past the accepted ones, struck through
        r.positions.filter(p => p.depth > r.accepted).forEach(p => box.appendChild(el('span', {className: 'ghost ' + p.verdict,
          title: p.verdict + ' draft'}, p.text)));
      }
      box.appendChild(el('span', {className: 'out ' + kinds[j] + (i === current ? ' current' : ''),
        title: kinds[j] + ' (round ' + r.index + ')'}, t));
    });
    if (i === rounds.length - 1 && r.tail) box.appendChild(el('span', {className: 'out target'}, r.tail));
  }
  const cur = box.querySelector('.current'); if (cur) cur.scrollIntoView({block: 'nearest'});
}

function renderRound() {
  const r = rounds[current];
  $('round-counter').textContent = 'Round ' + current + ' / ' + (rounds.length - 1);
  $('prev').disabled = current === 0; $('next').disabled = current === rounds.length - 1;
  $('round-title').textContent = current === 0 ? 'Prefill' : !r.drafter ? 'plain step (nothing drafted)' :
    r.drafter + ', γ = ' + r.gamma + ': ' + r.accepted + ' of ' + r.drafted + (r.tree
      ? ' levels accepted; ' + r.verified_tokens + ' nodes verified, ' + r.positions.length + ' of them tested'
      : ' drafts accepted');
  $('accept-header').textContent = r.tree ? 'accept prob. (after rejected siblings)' : 'min(1, p/q)';
  $('round-reason').textContent = r.reason + ' · draft ' + fmt(r.draft_seconds * 1000, 1) + ' ms, verify ' +
    fmt(r.verify_seconds * 1000, 1) + ' ms';
  const body = $('positions'); body.textContent = '';
  r.positions.forEach((p, i) => {
    const tr = el('tr', {className: 'pos' + (focus === i ? ' focus' : '')});
    [String(p.depth), show(p.text), p.q === null ? (r.tree ? '1 (candidate)' : '1 (lookup)') : fmt(p.q), fmt(p.p), fmt(p.accept_probability),
     p.uniform === null ? (data.greedy ? 'argmax' : '–') : fmt(p.uniform), p.verdict].forEach((v, k) =>
      tr.appendChild(el('td', {className: k === 1 ? 'tok' : (k === 6 ? 'v-' + p.verdict : '')}, v)));
    tr.onclick = () => { focus = i; render(); };
    body.appendChild(tr);
  });
  const tr = el('tr', {className: 'pos' + (focus === 'next' ? ' focus' : '')});
  ['+', show(r.next_text), '', '', '', '', r.next_kind + (r.next_from === 'residual' ? ' (from the residual)' : '')]
    .forEach((v, k) => tr.appendChild(el('td', {className: k === 1 ? 'tok' : ''}, v)));
  tr.onclick = () => { focus = 'next'; render(); };
  body.appendChild(tr);
  renderTree(r);
  renderBars(r);
}

function renderTree(r) {  // a tree round: every node, depth by indentation, the accepted path in green
  const box = $('tree'); box.textContent = '';
  if (!r.tree) return;
  const t = r.tree, onPath = new Set(t.path), children = t.parents.map(() => []), roots = [];
  t.parents.forEach((parent, i) => (parent < 0 ? roots : children[parent]).push(i));
  box.appendChild(el('h2', {}, 'Token tree: ' + t.tokens.length + ' nodes, ' + r.drafted + ' deep, ' + t.path.length +
    ' accepted'));
  const visit = (i, depth) => {
    box.appendChild(el('div', {className: 'node' + (onPath.has(i) ? ' on-path' : '')},
      '  '.repeat(depth) + '└ ' + show(t.texts[i])));
    children[i].forEach(c => visit(c, depth + 1));
  };
  roots.forEach(i => visit(i, 0));
}

function bar(cls, prob) { return el('div', {className: 'bar ' + cls, style: 'width:' + Math.max(0.5, prob * 100) + '%'}); }

function renderBars(r) {
  const box = $('bars'); box.textContent = '';
  if (focus === 'next' || focus === null || focus >= r.positions.length) {
    $('bars-title').textContent = (r.next_from === 'residual'
      ? (r.tree ? 'Residual: p without the rejected candidates, renormalised; the correction drawn from it'
                : 'Residual norm(max(0, p − q)) at the rejection, the correction drawn from it')
      : (data.greedy ? 'Target softmax (greedy takes the argmax)' : 'Target p')) + ': ' + show(r.next_text);
    r.next_top.forEach(t => { const row = el('div', {className: 'row' + (t.id === r.next_token ? ' chosen' : '')});
      row.appendChild(el('div', {className: 'label'}, show(t.text)));
      const cell = el('div'); cell.appendChild(bar(r.next_from === 'residual' ? 'r' : 'p', t.prob)); row.appendChild(cell);
      row.appendChild(el('div', {}, fmt(t.prob))); box.appendChild(row); });
    return;
  }
  const p = r.positions[focus], afterSiblings = p.residual_top.length > 0;
  $('bars-title').textContent = 'Position ' + p.depth + ', draft ' + show(p.text) + ': ' +
    (data.greedy ? 'target softmax (blue; greedy accepts only the argmax)' : 'p (blue)') +
    (afterSiblings ? ', r = p without the rejected siblings, renormalised, which it was tested against (purple)' : '') +
    ' and q (orange)';
  const ids = new Map(), entry = (t) => ids.get(t.id) || {text: t.text, p: null, q: null, r: null};
  p.target_top.forEach(t => ids.set(t.id, {text: t.text, p: t.prob, q: null, r: null}));
  p.draft_top.forEach(t => { const e = entry(t); e.q = t.prob; ids.set(t.id, e); });
  p.residual_top.forEach(t => { const e = entry(t); e.r = t.prob; ids.set(t.id, e); });
  if (!ids.has(p.token)) ids.set(p.token, {text: p.text, p: p.p, q: p.q, r: null});
  if (p.q === null) ids.get(p.token).q = 1;
  if (afterSiblings) ids.get(p.token).r = p.accept_probability;
  [...ids.entries()].sort((a, b) => (b[1].p || 0) - (a[1].p || 0)).forEach(([id, e]) => {
    const row = el('div', {className: 'row' + (id === p.token ? ' chosen' : '')});
    row.appendChild(el('div', {className: 'label'}, show(e.text)));
    const cell = el('div'); cell.appendChild(bar('p', e.p || 0));
    if (afterSiblings) cell.appendChild(bar('r', e.r || 0));
    cell.appendChild(bar('q', e.q || 0)); row.appendChild(cell);
    row.appendChild(el('div', {}, fmt(e.p) + (afterSiblings ? ' / ' + fmt(e.r) : '') + ' / ' +
      (e.q === null ? '–' : fmt(e.q)))); box.appendChild(row); });
}

function defaultFocus() {  // the first draft past the accepted ones, if any
  const first = rounds[current].positions.findIndex(p => p.depth > rounds[current].accepted);
  return first >= 0 ? first : 'next'; }

function render() { renderText(); renderRound(); }
function go(i) { current = Math.max(0, Math.min(rounds.length - 1, i)); focus = defaultFocus(); render(); }
$('prev').onclick = () => go(current - 1);
$('next').onclick = () => go(current + 1);
document.addEventListener('keydown', (e) => {
  if (e.key === 'ArrowRight' || e.key === 'n') go(current + 1);
  else if (e.key === 'ArrowLeft' || e.key === 'p') go(current - 1);
  else if (e.key === 'Home') go(0);
  else if (e.key === 'End') go(rounds.length - 1);
});

function renderSummary() {
  const s = data.summary, t = $('summary-table');
  const rows = [['new tokens', s.new_tokens], ['target passes', s.target_passes],
    ['drafted / accepted (draft positions: a tree counts its depth)', s.drafted + ' / ' + s.accepted],
    ['α (accepted / drafted)', fmt(s.alpha)],
    ...(s.verified_tokens !== s.drafted ? [['draft tokens verified (a tree: its nodes)', s.verified_tokens]] : []),
    ['mean γ (draft positions per proposal)', fmt(s.mean_gamma, 2)],
    ['MAT (tokens per pass)', fmt(s.mat, 2) + ' = ' + s.new_tokens + ' tokens / ' + s.target_passes + ' passes, prefill included'],
    ...(s.past_the_end ? [['past the end', s.past_the_end]] : []),  // why accepted can run ahead of MAT
    ['tokens per second', fmt(s.tokens_per_second, 2)],
    ['plain decoding, tokens per second', s.plain_tokens_per_second === null ? 'not run' : fmt(s.plain_tokens_per_second, 2)],
    ['speed-up (the whole run over plain decoding, run side by side)', s.speedup === null ? 'not measured' : fmt(s.speedup, 2) + '×']];
  rows.forEach(([k, v]) => { const tr = el('tr'); tr.appendChild(el('td', {}, k)); tr.appendChild(el('td', {}, String(v))); t.appendChild(tr); });
  const b = $('breakdown');
  s.breakdown.forEach(r => { const tr = el('tr');
    [r.drafter, r.rounds, fmt(r.drafting_share, 2), r.gamma, fmt(r.alpha), fmt(r.c, 4), fmt(r.verify_cost, 2),
     fmt(r.predicted_speedup, 2) + '×', fmt(r.costed_speedup, 2) + '×',
     r.measured_speedup === null ? '–' : fmt(r.measured_speedup, 2) + '×'].forEach(v => tr.appendChild(el('td', {}, String(v))));
    b.appendChild(tr); });
  const w = $('worked'); s.worked_example.forEach(line => w.appendChild(el('li', {}, line)));
  if (!s.worked_example.length) w.appendChild(el('li', {}, 'Nothing was drafted, so there is nothing to fill in.'));
}
renderSummary();
go(0);
"""

BODY = """
<header><h1>specdec explain</h1><div class="meta" id="meta">{meta}</div></header>
<main>
  <div id="controls">
    <button id="prev" title="previous round (←)">◀ previous</button>
    <span id="round-counter"></span>
    <button id="next" title="next round (→)">next ▶</button>
    <span class="hint">← → step through rounds, Home / End jump; click a row to see its distributions</span>
  </div>
  <section>
    <h2>Text</h2>
    <div class="legend"><span class="out accepted">accepted draft</span><span class="out corrected">correction</span><span class="out bonus">bonus</span><span>target step</span><span class="ghost">rejected draft</span></div>
    <div id="text"></div>
  </section>
  <section>
    <h2 id="round-title"></h2>
    <div class="reason" id="round-reason"></div>
    <table><thead><tr><th>#</th><th>token</th><th>q(x)</th><th>p(x)</th><th id="accept-header">min(1, p/q)</th><th>u</th><th>verdict</th></tr></thead>
    <tbody id="positions"></tbody></table>
    <div id="tree"></div>
    <h2 id="bars-title" style="margin-top:12px"></h2>
    <div class="bars" id="bars"></div>
  </section>
  <section id="summary">
    <h2>Measured and predicted</h2>
    <table id="summary-table"></table>
    <h2 style="margin-top:12px">Per drafter, × plain decoding's tokens per second: the models on this run's own numbers, and its rounds</h2>
    <table><thead><tr><th>drafter</th><th>rounds</th><th>f</th><th>γ</th><th>α</th><th>c</th><th>v</th><th>model</th><th>costed</th><th>its rounds</th></tr></thead>
    <tbody id="breakdown"></tbody></table>
    <p class="hint">f: share of its rounds that drafted; c: draft cost per token / one target pass; v: a pass over the verified draft tokens + 1 (a chain: γ + 1; a tree: its nodes + 1) / a one-token pass; model: the acceptance model's prediction from α, γ, f, c, v; costed: the cost model with the acceptance as it happened; its rounds: the tokens its rounds committed per second of those rounds. Each is over plain decoding's rate; none is the speed-up above, which is the whole run's, the prefill and every round included.</p>
    <h2>Worked example</h2>
    <ul id="worked"></ul>
  </section>
</main>
"""


def render_page(data: dict) -> str:
    """The run (prompt_text, greedy, rounds, summary, meta) → one self-contained HTML document."""
    payload = json.dumps(data, ensure_ascii=True).replace("/", "\\/")
    payload = re.sub(r"([hH])(?=[tT][tT][pP])", lambda m: f"\\u{ord(m.group(1)):04x}", payload)
    meta = html.escape(data.get("meta", ""))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>specdec explain</title><style>{STYLE}</style></head><body>"
            + BODY.replace("{meta}", meta)
            + f"<script type=\"application/json\" id=\"run-data\">{payload}</script>"
            + f"<script>{SCRIPT}</script></body></html>\n")
