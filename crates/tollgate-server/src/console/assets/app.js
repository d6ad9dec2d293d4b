// The tollgate console: a page over the JSON API of /v1/console and /v1/rules. Plain
// JavaScript, no dependencies, nothing fetched from elsewhere. The admin token lives in this
// tab's sessionStorage only. Every value that comes from traffic (keys, paths, headers) is
// escaped before it is shown.
'use strict';

const TOKEN = 'tollgate-token';
const REFRESH_MS = 2000;
let timer = null;
// Counts the views shown: an answer asked for by an earlier view is dropped (see `Stale`).
let shown = 0;

// ---- helpers ----------------------------------------------------------------------------

function esc(value) {
  return String(value ?? '').replace(/[&<>"']/g, (c) => ({
    '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;',
  }[c]));
}

function $(selector, root = document) { return root.querySelector(selector); }
function $$(selector, root = document) { return Array.from(root.querySelectorAll(selector)); }

function number(n, digits = 0) {
  if (n === null || n === undefined || Number.isNaN(n)) return '–';
  return Number(n).toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

function ago(seconds, now) {
  const d = Math.max(0, now - seconds);
  if (d < 60) return `${d} s ago`;
  if (d < 3600) return `${Math.floor(d / 60)} min ago`;
  return `${Math.floor(d / 3600)} h ago`;
}

function clock(seconds) {
  return new Date(seconds * 1000).toLocaleTimeString('en-GB');
}

function micros(us) {
  if (!us) return '–';
  return us >= 1000 ? `${number(us / 1000, 2)} ms` : `${number(us)} µs`;
}

class Unauthorized extends Error {}

// Raised by `api` when the view changed while the answer was on its way: the view that
// asked is gone, so it must not draw over the new one.
class Stale extends Error {}

async function api(method, path, body, raw = false) {
  const asked = shown;
  const headers = { Authorization: `Bearer ${sessionStorage.getItem(TOKEN) || ''}` };
  const init = { method, headers };
  if (body !== undefined) {
    if (raw) {
      headers['Content-Type'] = 'application/yaml';
      init.body = body;
    } else {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
  }
  const response = await fetch(path, init);
  if (asked !== shown && method === 'GET') throw new Stale();
  if (response.status === 401 || response.status === 403) throw new Unauthorized();
  const text = await response.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch { json = { error: text }; }
  return { status: response.status, ok: response.ok, json };
}

// ---- charts -----------------------------------------------------------------------------

// A line chart of `series` ({name, color, values}) over `labels` (x, in seconds since the
// epoch), the legend above the plot, never over the data.
function chart(labels, series, opts = {}) {
  const width = opts.width || 900;
  const height = opts.height || 200;
  const pad = { left: 48, right: 12, top: 10, bottom: 26 };
  const w = width - pad.left - pad.right;
  const h = height - pad.top - pad.bottom;
  const top = Math.max(1, ...series.flatMap((s) => s.values));
  const nice = niceCeil(top);
  const x = (i) => pad.left + (labels.length <= 1 ? 0 : (i * w) / (labels.length - 1));
  const y = (v) => pad.top + h - (v / nice) * h;
  let svg = `<svg class="chart" viewBox="0 0 ${width} ${height}" role="img" aria-label="${esc(opts.title || 'chart')}">`;
  // Five steps: a fifth of 1, 2, 2.5 or 5 times a power of ten is a round number.
  for (let k = 0; k <= 5; k += 1) {
    const v = (nice * k) / 5;
    const yy = y(v);
    svg += `<line x1="${pad.left}" x2="${width - pad.right}" y1="${yy}" y2="${yy}" stroke="#e8ecf1"/>`;
    svg += `<text x="${pad.left - 6}" y="${yy + 4}" text-anchor="end">${esc(number(v, v < 10 && v % 1 ? 1 : 0))}</text>`;
  }
  const ticks = Math.min(6, labels.length);
  for (let k = 0; k < ticks; k += 1) {
    const i = Math.round((k * (labels.length - 1)) / Math.max(1, ticks - 1));
    const anchor = k === 0 ? 'start' : k === ticks - 1 ? 'end' : 'middle';
    svg += `<text x="${x(i)}" y="${height - 6}" text-anchor="${anchor}">${esc(clock(labels[i]))}</text>`;
  }
  for (const s of series) {
    const points = s.values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(' ');
    svg += `<polyline fill="none" stroke="${s.color}" stroke-width="${s.width || 1.8}" points="${points}" data-series="${esc(s.name)}"/>`;
  }
  svg += '</svg>';
  const legend = series.map((s) => `<span><i style="background:${s.color}"></i>${esc(s.name)}</span>`).join('');
  return `<div class="legend">${legend}</div>${svg}`;
}

function niceCeil(v) {
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

const COLORS = {
  allowed: '#2e9d5a', denied: '#d1443b', shadow: '#d99a1e', near: '#7a5bd1', offered: '#8d99a8',
};

// ---- routing ----------------------------------------------------------------------------

function route() {
  clearTimeout(timer);
  shown += 1;
  const hash = location.hash || '#/overview';
  const [, view, ...rest] = hash.split('/');
  const arg = rest.map(decodeURIComponent).join('/');
  $$('header nav a').forEach((a) => a.classList.toggle('active', a.dataset.view === view || (view === 'rule' && a.dataset.view === 'rules')));
  const views = { overview, rules, rule, edit, new: edit, explain, plans, lists, audit };
  const show = views[view] || overview;
  show(arg, view).catch(failed);
}

function failed(e) {
  if (e instanceof Stale) return;
  if (e instanceof Unauthorized) {
    signOut('The token was refused.');
    return;
  }
  $('#view').innerHTML = `<div class="message bad">${esc(e.message || e)}</div>`;
}

function again(fn) {
  clearTimeout(timer);
  timer = setTimeout(() => fn().catch(failed), REFRESH_MS);
}

// ---- sign in ----------------------------------------------------------------------------

function signOut(message) {
  sessionStorage.removeItem(TOKEN);
  clearTimeout(timer);
  $('#bar').hidden = true;
  $('#view').innerHTML = '';
  $('#login').hidden = false;
  $('#login-error').textContent = message || '';
  $('#token').focus();
}

async function signIn() {
  const token = $('#token').value.trim();
  if (!token) return;
  sessionStorage.setItem(TOKEN, token);
  try {
    const r = await api('GET', '/v1/console/overview');
    if (!r.ok) throw new Error(r.json?.error || `HTTP ${r.status}`);
    $('#token').value = '';
    $('#login').hidden = true;
    $('#bar').hidden = false;
    route();
  } catch (e) {
    signOut(e instanceof Unauthorized ? 'The token was refused.' : String(e.message || e));
  }
}

// ---- overview ---------------------------------------------------------------------------

async function overview() {
  const r = await api('GET', '/v1/console/overview');
  const o = r.json;
  $('#who').textContent = `${o.instance} · v${o.version}`;
  const s = o.store;
  const health = s.down ? '<span class="badge bad">down</span>'
    : s.degraded ? '<span class="badge warn">degraded: failure policies deciding</span>'
      : '<span class="badge good">healthy</span>';
  const labels = o.seconds.map((p) => p.at);
  const nodes = (s.nodes || []).map((n) => `<tr><td class="mono">${esc(n.address)}</td><td class="num">${number(n.slots)}</td><td>${n.failing ? '<span class="badge bad">failing</span>' : '<span class="badge good">up</span>'}</td></tr>`).join('');
  const instances = o.instances.map((i) => `<tr data-instance="${esc(i.id)}"><td class="mono">${esc(i.id)}${i.self ? ' <span class="badge">this one</span>' : ''}</td><td>${esc(i.version)}</td><td>${esc(ago(i.started, o.now))}</td><td>${esc(ago(i.seen, o.now))}</td><td class="num">${number(i.rate, 1)}/s</td></tr>`).join('');
  const lastError = o.status.last_error
    ? `<div class="message bad" id="reload-error">Last reload rejected ${esc(ago(o.status.last_error[0], o.now))}: ${esc(o.status.last_error[1])}</div>`
    : '<p class="ok" id="reload-ok">The files in use loaded without error.</p>';
  $('#view').innerHTML = `
    <h1>Overview</h1>
    <div class="cards">
      <div class="card"><div class="label">Admitted</div><div class="big" id="rate-allowed">${number(o.rate.allowed, 1)}/s</div><div class="sub">over the last 10 s</div></div>
      <div class="card"><div class="label">Denied</div><div class="big" id="rate-denied" style="color:var(--denied)">${number(o.rate.denied, 1)}/s</div><div class="sub">over the last 10 s</div></div>
      <div class="card"><div class="label">Denied in shadow</div><div class="big" id="rate-shadow" style="color:#9a6a0c">${number(o.rate.shadow, 1)}/s</div><div class="sub">admitted anyway</div></div>
      <div class="card"><div class="label">Check latency</div><div class="big" id="latency">${esc(micros(o.latency.p50_us))}</div><div class="sub">p50 · p99 ${esc(micros(o.latency.p99_us))} (1 min)</div></div>
      <div class="card"><div class="label">Store</div><div class="big" id="store-kind">${esc(s.kind)}</div><div class="sub" id="store-health">${health}</div></div>
    </div>
    <div class="panel"><h2>Decisions per second, last two minutes</h2>
      ${chart(labels, [
    { name: 'admitted', color: COLORS.allowed, values: o.seconds.map((p) => p.allowed) },
    { name: 'denied', color: COLORS.denied, values: o.seconds.map((p) => p.denied) },
    { name: 'denied in shadow', color: COLORS.shadow, values: o.seconds.map((p) => p.shadow) },
  ], { title: 'decisions per second' })}
    </div>
    <div class="row">
      <div class="panel"><h2>Store</h2>
        <dl class="kv">
          <dt>Kind</dt><dd>${esc(s.kind)}</dd>
          <dt>Health</dt><dd>${health}</dd>
          ${s.keys !== undefined ? `<dt>Keys held</dt><dd>${number(s.keys)} (${number(s.bytes / 1048576, 1)} MiB)</dd>` : ''}
          ${s.ping ? `<dt>Redis latency</dt><dd>${s.ping.us !== undefined ? `${number(s.ping.us)} µs (a PING now)` : `<span class="error">${esc(s.ping.error)}</span>`}</dd>` : ''}
          ${s.failures ? `<dt>Failed calls</dt><dd>${number(s.failures.errors)} errors, ${number(s.failures.timeouts)} timeouts</dd>` : ''}
        </dl>
        ${nodes ? `<h2 style="margin-top:1rem">Cluster masters</h2><table><thead><tr><th>Node</th><th class="num">Slots</th><th></th></tr></thead><tbody>${nodes}</tbody></table>` : ''}
      </div>
      <div class="panel"><h2>Rule files</h2>
        <p class="muted">Version ${number(o.status.version)}, loaded ${esc(ago(o.status.loaded_at, o.now))}.</p>
        ${lastError}
        <ul class="mono" id="files">${o.files.map((f) => `<li>${esc(f)}</li>`).join('')}</ul>
        <p class="muted">The preview replays ${number(o.recorder.requests)} requests recorded${o.recorder.since ? ` since ${esc(clock(o.recorder.since))}` : ''} (${number(o.recorder.bytes / 1048576, 1)} MiB). ${o.recorder.until ? `Requests are recorded while the console is in use, and until ${esc(clock(o.recorder.until))}.` : 'Requests are recorded always.'}</p>
      </div>
    </div>
    <div class="panel"><h2>Instances</h2>
      <table id="instances"><thead><tr><th>Instance</th><th>Version</th><th>Started</th><th>Last seen</th><th class="num">Decisions</th></tr></thead><tbody>${instances}</tbody></table>
    </div>`;
  again(overview);
}

// ---- rules ------------------------------------------------------------------------------

let rulesFilter = { text: '', kind: 'all' };

function tiersText(tiers) {
  return tiers.map((t) => `${number(t.limit)}/${esc(t.period)}${t.burst ? ` (burst ${number(t.burst)})` : ''}`).join(' and ');
}

function matchText(rule) {
  if (!rule.match) return '<span class="muted">Envoy descriptor</span>';
  const m = rule.match;
  const methods = (m.methods || []).join(', ') || 'any method';
  const headers = Object.entries(m.headers || {}).map(([k, v]) => `${k}: ${v}`).join(', ');
  return `${esc(methods)} <span class="mono">${esc(m.path || 'any path')}</span>${headers ? ` <span class="muted">${esc(headers)}</span>` : ''}`;
}

async function rules() {
  const r = await api('GET', '/v1/console/rules');
  const list = r.json.rules;
  const shown = list.filter((rule) => {
    const text = rulesFilter.text.toLowerCase();
    const hay = `${rule.id} ${rule.algorithm} ${rule.source} ${(rule.key || []).join(' ')} ${rule.match?.path || ''}`.toLowerCase();
    if (text && !hay.includes(text)) return false;
    switch (rulesFilter.kind) {
      case 'denying': return rule.denied_per_minute > 0;
      case 'shadow': return rule.shadow;
      case 'native': return rule.source !== 'envoy';
      case 'envoy': return rule.source === 'envoy';
      default: return true;
    }
  });
  const rows = shown.map((rule) => `
    <tr class="clickable" data-rule="${esc(rule.id)}">
      <td><a href="#/rule/${encodeURIComponent(rule.id)}" class="mono">${esc(rule.id)}</a><br>
        <span class="badge">${esc(rule.source)}</span>${rule.shadow ? '<span class="badge warn">shadow</span>' : ''}${rule.enabled ? '' : '<span class="badge">disabled</span>'}</td>
      <td>${matchText(rule)}</td>
      <td class="mono">${esc((rule.key || []).join(', ') || '–')}</td>
      <td>${esc(rule.algorithm)}<br><span class="muted">${tiersText(rule.tiers)}</span></td>
      <td>${esc(rule.on_failure)}<br><span class="muted">${esc(rule.store)}</span></td>
      <td class="num rate">${number(rule.rate, 1)}/s</td>
      <td class="num denied">${number(rule.denied_per_minute)}</td>
      <td><div class="bar${rule.in_use >= 0.8 ? ' hot' : ''}" title="${number(rule.in_use * 100)}%"><span style="width:${Math.min(100, rule.in_use * 100)}%"></span></div></td>
    </tr>`).join('');
  const focused = document.activeElement?.id;
  $('#view').innerHTML = `
    <h1>Rules</h1>
    <div class="toolbar">
      <input type="search" id="rules-search" placeholder="Search id, path, key, algorithm" value="${esc(rulesFilter.text)}">
      <select id="rules-kind">
        ${['all', 'denying', 'shadow', 'native', 'envoy'].map((k) => `<option value="${k}"${k === rulesFilter.kind ? ' selected' : ''}>${k}</option>`).join('')}
      </select>
      <span class="muted">${shown.length} of ${list.length} rules</span>
      <a href="#/new"><button type="button" class="primary">New rule</button></a>
    </div>
    <div class="panel"><table id="rules-table">
      <thead><tr><th>Rule</th><th>Matches</th><th>Key</th><th>Algorithm and tiers</th><th>On failure</th><th class="num">Rate</th><th class="num">Denied/min</th><th>Limit in use</th></tr></thead>
      <tbody>${rows || '<tr><td colspan="8" class="muted">No rule matches.</td></tr>'}</tbody>
    </table></div>`;
  const search = $('#rules-search');
  search.addEventListener('input', () => { rulesFilter.text = search.value; rules().catch(failed); });
  $('#rules-kind').addEventListener('change', (e) => { rulesFilter.kind = e.target.value; rules().catch(failed); });
  if (focused === 'rules-search') { search.focus(); search.setSelectionRange(search.value.length, search.value.length); }
  $$('tr[data-rule]').forEach((tr) => tr.addEventListener('click', (e) => {
    if (e.target.closest('a')) return;
    location.hash = `#/rule/${encodeURIComponent(tr.dataset.rule)}`;
  }));
  again(rules);
}

// ---- one rule ---------------------------------------------------------------------------

function hotRows(list, id, slots) {
  if (!list.length) return '<tr><td colspan="5" class="muted">No traffic in the last two minutes.</td></tr>';
  return list.map((k) => `
    <tr data-key="${esc(k.key)}">
      <td class="mono" title="${esc(k.key)}">${esc(k.display || k.key)}${k.cut ? '…' : ''}</td>
      <td class="num" title="${k.estimated ? 'estimated from a sample of the checks (heavy traffic)' : ''}">${k.estimated ? '≈' : ''}${number(k.count)}${k.error ? ` <span class="muted">±${number(k.error)}</span>` : ''}</td>
      <td class="num">${k.in_use !== undefined ? `${number(k.in_use)} of ${number(k.limit)} slots` : k.remaining !== undefined ? `${number(k.remaining)} of ${number(k.limit)}` : '–'}</td>
      <td class="num">${k.reset_after_s !== undefined ? `${number(k.reset_after_s, 1)} s` : '–'}</td>
      <td>${k.cut ? '' : `<button type="button" class="danger reset" data-rule="${esc(id)}" data-key="${esc(k.key)}">Reset</button>`}</td>
    </tr>`).join('');
}

// A global rule's hottest keys: what each region admitted of each in this window.
function regionsPanel(hot) {
  const keyed = hot.filter((h) => h.regions);
  if (!keyed.length) return '';
  const regions = [...new Set(keyed.flatMap((h) => h.regions.map((r) => r.region)))].sort();
  const head = regions.map((r) => `<th class="num">${esc(r)}</th>`).join('');
  const rows = keyed.map((h) => {
    const cells = regions.map((r) => {
      const found = h.regions.find((x) => x.region === r);
      return `<td class="num">${found ? found.admitted : 0}</td>`;
    }).join('');
    return `<tr><td class="mono">${esc(h.display)}</td>${cells}</tr>`;
  }).join('');
  return `<div class="panel"><h2>Use per region, this window</h2>
    <table id="hot-regions"><thead><tr><th>Key</th>${head}</tr></thead><tbody>${rows}</tbody></table></div>`;
}

async function rule(id) {
  const r = await api('GET', `/v1/console/rules/${encodeURIComponent(id)}`);
  if (r.status === 404) throw new Error(`No rule ${id}.`);
  const d = r.json;
  const rule = d.rule;
  const native = rule.source !== 'envoy';
  const slots = rule.algorithm === 'concurrency';
  const seconds = d.seconds;
  const minutes = d.minutes;
  $('#view').innerHTML = `
    <h1><span class="mono">${esc(rule.id)}</span> <span class="badge">${esc(rule.source)}</span>${rule.shadow ? '<span class="badge warn">shadow</span>' : ''}${rule.enabled ? '' : '<span class="badge">disabled</span>'}</h1>
    <div class="toolbar">
      ${native ? `<a href="#/edit/${encodeURIComponent(rule.id)}"><button type="button" class="primary" id="edit">Edit</button></a>
      <button type="button" id="toggle-enabled">${rule.enabled ? 'Disable' : 'Enable'}</button>
      <button type="button" id="toggle-shadow">${rule.shadow ? 'Enforce' : 'Shadow'}</button>
      <button type="button" class="danger" id="delete">Delete</button>` : '<span class="muted">Envoy rules change in their files.</span>'}
      <span id="rule-message"></span>
    </div>
    ${native ? `<p class="muted" id="rule-plans"><a href="#/plans/${encodeURIComponent(rule.id)}">Tenants' plans</a>: this rule's tiers set for one key or a pattern of keys.</p>` : ''}
    <div class="row">
      <div class="panel"><h2>Definition</h2>
        <dl class="kv">
          <dt>Matches</dt><dd>${matchText(rule)}</dd>
          <dt>Key</dt><dd class="mono">${esc((rule.key || []).join(', ') || '–')}</dd>
          <dt>Algorithm</dt><dd>${esc(rule.algorithm)}</dd>
          <dt>Tiers</dt><dd>${tiersText(rule.tiers)}</dd>
          <dt>On failure</dt><dd>${esc(rule.on_failure)}</dd>
          <dt>Store</dt><dd>${esc(rule.store)}</dd>
        </dl>
      </div>
    </div>
    <div class="panel"><h2>Last two minutes, per second</h2>
      ${chart(seconds.map((p) => p.at), [
    { name: 'admitted', color: COLORS.allowed, values: seconds.map((p) => p.allowed) },
    { name: 'denied', color: COLORS.denied, values: seconds.map((p) => p.denied) },
    { name: 'near the limit', color: COLORS.near, values: seconds.map((p) => p.near) },
  ], { title: 'per second' })}
    </div>
    <div class="panel"><h2>Last hour, per minute</h2>
      ${chart(minutes.map((p) => p.at), [
    { name: 'admitted', color: COLORS.allowed, values: minutes.map((p) => p.allowed) },
    { name: 'denied', color: COLORS.denied, values: minutes.map((p) => p.denied) },
    { name: 'near the limit', color: COLORS.near, values: minutes.map((p) => p.near) },
  ], { title: 'per minute', height: 170 })}
    </div>
    <div class="row">
      <div class="panel"><h2>Hottest keys by hits</h2>
        <table id="hot-hits"><thead><tr><th>Key</th><th class="num">Hits</th><th class="num">${slots ? 'In use' : 'Left'}</th><th class="num">Reset</th><th></th></tr></thead><tbody>${hotRows(d.hot.hits, rule.id, slots)}</tbody></table></div>
      <div class="panel"><h2>Hottest keys by denials</h2>
        <table id="hot-denials"><thead><tr><th>Key</th><th class="num">Denials</th><th class="num">${slots ? 'In use' : 'Left'}</th><th class="num">Reset</th><th></th></tr></thead><tbody>${hotRows(d.hot.denials, rule.id, slots)}</tbody></table></div>
    </div>
    ${regionsPanel(d.hot.hits)}`;
  $$('button.reset').forEach((b) => b.addEventListener('click', async () => {
    if (!confirm(`Reset the count of ${b.dataset.key} under ${b.dataset.rule}?`)) return;
    const res = await api('POST', `/v1/console/rules/${encodeURIComponent(b.dataset.rule)}/reset`, { key: b.dataset.key });
    $('#rule-message').innerHTML = res.ok ? `<span class="ok">Reset ${esc(b.dataset.key)}.</span>` : `<span class="error">${esc(res.json?.error)}</span>`;
    rule(id).catch(failed);
  }));
  if (native && d.spec) {
    const save = async (spec, what) => {
      const res = await api('PUT', `/v1/rules/${encodeURIComponent(id)}`, spec);
      $('#rule-message').innerHTML = res.ok ? `<span class="ok">${esc(what)}.</span>` : `<span class="error">${esc(res.json?.error)}</span>`;
      rule(id).catch(failed);
    };
    $('#toggle-enabled').addEventListener('click', () => save({ ...d.spec, enabled: !d.spec.enabled }, d.spec.enabled ? 'Disabled' : 'Enabled'));
    $('#toggle-shadow').addEventListener('click', () => save({ ...d.spec, shadow: !d.spec.shadow }, d.spec.shadow ? 'Enforced' : 'In shadow mode'));
    $('#delete').addEventListener('click', async () => {
      if (!confirm(`Delete the rule ${id}?`)) return;
      const res = await api('DELETE', `/v1/rules/${encodeURIComponent(id)}`);
      if (res.ok) { location.hash = '#/rules'; } else { $('#rule-message').innerHTML = `<span class="error">${esc(res.json?.error)}</span>`; }
    });
  }
  again(() => rule(id));
}

// ---- the editor -------------------------------------------------------------------------

const ALGORITHMS = ['fixed_window', 'sliding_window', 'sub_windows(10)', 'sliding_log', 'token_bucket',
  'interval_bucket', 'leaky_bucket', 'leaky_bucket(shaper)', 'gcra', 'warm_up(10s)', 'hit_counter'];

function blankSpec() {
  return {
    id: '', enabled: true, shadow: true, match: { methods: ['GET'], path: '/v1/*' }, key: ['client_ip'],
    algorithm: 'sliding_window', tiers: [{ limit: 100, period: '1m' }], on_failure: 'open',
  };
}

// A rule as YAML, the shape the files write.
function toYaml(spec) {
  const q = (s) => (/^[\w./-]+$/.test(s) && !/^(true|false|null|yes|no|on|off|~|\d)/i.test(s) ? s : JSON.stringify(s));
  const lines = [`id: ${q(spec.id)}`, `enabled: ${spec.enabled}`];
  if (spec.shadow) lines.push('shadow: true');
  const m = spec.match || {};
  const match = [];
  if (m.methods?.length) match.push(`  methods: [${m.methods.map(q).join(', ')}]`);
  if (m.path) match.push(`  path: ${q(m.path)}`);
  const headers = Object.entries(m.headers || {});
  if (headers.length) match.push(`  headers: { ${headers.map(([k, v]) => `${q(k)}: ${q(v)}`).join(', ')} }`);
  if (match.length) lines.push('match:', ...match);
  if (spec.key?.length) lines.push(`key: [${spec.key.map(q).join(', ')}]`);
  lines.push(`algorithm: ${q(spec.algorithm)}`);
  lines.push('tiers:');
  for (const t of spec.tiers) lines.push(`  - { limit: ${t.limit}, period: ${q(String(t.period))}${t.burst ? `, burst: ${t.burst}` : ''} }`);
  if (spec.on_failure && spec.on_failure !== 'open') lines.push(`on_failure: ${q(spec.on_failure)}`);
  return `${lines.join('\n')}\n`;
}

function readForm() {
  const headers = {};
  for (const line of $('#f-headers').value.split('\n')) {
    const i = line.indexOf(':');
    if (i > 0) headers[line.slice(0, i).trim()] = line.slice(i + 1).trim();
  }
  const tiers = $$('#f-tiers tr[data-tier]').map((tr) => {
    const t = { limit: Number($('input.limit', tr).value), period: $('input.period', tr).value.trim() };
    const burst = $('input.burst', tr).value.trim();
    if (burst) t.burst = Number(burst);
    return t;
  });
  const split = (v) => v.split(',').map((s) => s.trim()).filter(Boolean);
  return {
    id: $('#f-id').value.trim(),
    enabled: $('#f-enabled').checked,
    shadow: $('#f-shadow').checked,
    match: { methods: split($('#f-methods').value), path: $('#f-path').value.trim() || undefined, headers },
    key: split($('#f-key').value),
    algorithm: $('#f-algorithm').value.trim(),
    tiers,
    on_failure: $('#f-on-failure').value.trim() || 'open',
  };
}

function tierRow(t, i) {
  return `<tr data-tier="${i}">
    <td><input type="text" class="limit" id="f-tier-${i}-limit" data-field="tiers[${i}].limit" value="${esc(t.limit)}" placeholder="limit"></td>
    <td><input type="text" class="period" id="f-tier-${i}-period" data-field="tiers[${i}].period" value="${esc(t.period)}" placeholder="period (10s, 1m)"></td>
    <td><input type="text" class="burst" id="f-tier-${i}-burst" data-field="tiers[${i}].burst" value="${esc(t.burst ?? '')}" placeholder="burst"></td>
    <td><button type="button" class="drop-tier" data-tier="${i}">×</button></td></tr>`;
}

// A line diff of two texts (longest common subsequence of lines).
function diff(before, after) {
  const a = before.split('\n');
  const b = after.split('\n');
  const n = a.length;
  const m = b.length;
  const lcs = Array.from({ length: n + 1 }, () => new Array(m + 1).fill(0));
  for (let i = n - 1; i >= 0; i -= 1) for (let j = m - 1; j >= 0; j -= 1) lcs[i][j] = a[i] === b[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
  const out = [];
  let i = 0;
  let j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] === b[j]) { out.push(`  ${esc(a[i])}`); i += 1; j += 1; } else if (j < m && (i >= n || lcs[i][j + 1] >= lcs[i + 1][j])) { out.push(`<span class="add">+ ${esc(b[j])}</span>`); j += 1; } else { out.push(`<span class="del">- ${esc(a[i])}</span>`); i += 1; }
  }
  return out.join('\n');
}

function clearErrors() {
  $$('.invalid').forEach((e) => e.classList.remove('invalid'));
  $$('.field-error').forEach((e) => { e.textContent = ''; });
  $('#editor-message').innerHTML = '';
}

// Shows an error of the API at its field in the form (named in the message, `tiers[1].period:`)
// and at its line and column in the YAML.
function showError(err) {
  const message = err.error || 'invalid';
  const path = (message.match(/^(?:rule `[^`]*`: )?([a-z_]+(?:\[\d+\])?(?:\.[a-z_]+)?):/) || [])[1];
  const byLine = (err.line && err.column) ? ` (YAML line ${err.line}, column ${err.column})` : '';
  let input = path ? $(`[data-field="${path}"]`) : null;
  if (!input && path) input = $(`[data-field="${path.split('.')[0]}"]`);
  if (input) {
    input.classList.add('invalid');
    const slot = $(`.field-error[data-for="${input.dataset.field}"]`) || $(`.field-error[data-for="${input.dataset.field.split('[')[0]}"]`);
    if (slot) slot.textContent = message;
  }
  $('#editor-message').innerHTML = `<div class="message bad" id="error-message">${esc(message)}${esc(byLine)}</div>`;
  if (err.line) {
    const yaml = $('#yaml');
    const lines = yaml.value.split('\n');
    const start = lines.slice(0, err.line - 1).reduce((s, l) => s + l.length + 1, 0);
    yaml.classList.add('invalid');
    yaml.setSelectionRange(start, start + (lines[err.line - 1] || '').length);
  }
}

async function edit(id) {
  let current = null;
  if (id) {
    const r = await api('GET', `/v1/rules/${encodeURIComponent(id)}`);
    if (!r.ok) throw new Error(r.json?.error || `No rule ${id}.`);
    current = r.json;
  }
  const spec = current ? { ...current } : blankSpec();
  if (current && !current.match) spec.match = {};
  const m = spec.match || {};
  $('#view').innerHTML = `
    <h1>${current ? `Edit <span class="mono">${esc(id)}</span>` : 'New rule'}</h1>
    <div id="editor-message"></div>
    <div class="editor">
      <div class="panel form" id="form">
        <h2>Form</h2>
        <div class="field"><label for="f-id">Id</label><input type="text" id="f-id" data-field="id" value="${esc(spec.id)}" ${current ? 'readonly' : ''} placeholder="login-attempts"><div class="field-error" data-for="id"></div></div>
        <div class="field"><label><input type="checkbox" id="f-enabled" ${spec.enabled !== false ? 'checked' : ''}> Enabled</label>
          <label><input type="checkbox" id="f-shadow" ${spec.shadow ? 'checked' : ''}> Shadow mode (counts, never denies: try it before enforcing)</label></div>
        <div class="field"><label for="f-methods">Methods</label><input type="text" id="f-methods" data-field="match.methods" value="${esc((m.methods || []).join(', '))}" placeholder="GET, POST (none: any)"><div class="field-error" data-for="match.methods"></div></div>
        <div class="field"><label for="f-path">Path pattern</label><input type="text" id="f-path" data-field="match.path" value="${esc(m.path || '')}" placeholder="/v1/organizations/{org}/product/*"><div class="field-error" data-for="match.path"></div></div>
        <div class="field"><label for="f-headers">Headers (one <code>name: value</code> a line; <code>*</code> at the end: a prefix)</label><textarea id="f-headers" data-field="match.headers" rows="2">${esc(Object.entries(m.headers || {}).map(([k, v]) => `${k}: ${v}`).join('\n'))}</textarea></div>
        <div class="field"><label for="f-key">Key parts</label><input type="text" id="f-key" data-field="key" value="${esc((spec.key || []).join(', '))}" placeholder="segment:org, header:x-tenant, client_ip, method, route"><div class="field-error" data-for="key"></div></div>
        <div class="field"><label for="f-algorithm">Algorithm</label><input type="text" id="f-algorithm" data-field="algorithm" list="algorithms" value="${esc(spec.algorithm)}"><datalist id="algorithms">${ALGORITHMS.map((a) => `<option value="${a}">`).join('')}</datalist><div class="field-error" data-for="algorithm"></div></div>
        <div class="field"><label>Tiers (every one must admit)</label>
          <table class="tiers"><tbody id="f-tiers">${spec.tiers.map(tierRow).join('')}</tbody></table>
          <div class="field-error" data-for="tiers"></div>
          <button type="button" id="add-tier">Add a tier</button></div>
        <div class="field"><label for="f-on-failure">When the store fails</label><input type="text" id="f-on-failure" data-field="on_failure" value="${esc(spec.on_failure || 'open')}" placeholder="open, closed or local:0.25"><div class="field-error" data-for="on_failure"></div></div>
      </div>
      <div class="panel">
        <h2>YAML</h2>
        <textarea id="yaml" spellcheck="false">${esc(toYaml(spec))}</textarea>
        <div class="toolbar" style="margin-top:0.6rem">
          <button type="button" id="from-yaml">Form from YAML</button>
          <button type="button" id="validate">Validate</button>
          <button type="button" id="preview">Preview impact</button>
          <button type="button" id="review" class="primary">Review and save</button>
        </div>
      </div>
    </div>
    <div class="panel" id="preview-panel" hidden></div>
    <div class="panel" id="review-panel" hidden></div>`;
  const sync = () => { $('#yaml').value = toYaml(readForm()); };
  $('#form').addEventListener('input', sync);
  $('#form').addEventListener('change', sync);
  $('#add-tier').addEventListener('click', () => {
    const tiers = $('#f-tiers');
    tiers.insertAdjacentHTML('beforeend', tierRow({ limit: '', period: '1m' }, $$('tr', tiers).length));
    sync();
  });
  $('#f-tiers').addEventListener('click', (e) => {
    if (!e.target.classList.contains('drop-tier')) return;
    e.target.closest('tr').remove();
    sync();
  });
  $('#from-yaml').addEventListener('click', async () => {
    clearErrors();
    const r = await api('POST', '/v1/console/validate', $('#yaml').value, true);
    if (!r.ok) { showError(r.json); return; }
    const s = r.json.rule;
    $('#f-id').value = s.id;
    $('#f-enabled').checked = s.enabled;
    $('#f-shadow').checked = s.shadow;
    $('#f-methods').value = (s.match?.methods || []).join(', ');
    $('#f-path').value = s.match?.path || '';
    $('#f-headers').value = Object.entries(s.match?.headers || {}).map(([k, v]) => `${k}: ${v}`).join('\n');
    $('#f-key').value = (s.key || []).join(', ');
    $('#f-algorithm').value = s.algorithm;
    $('#f-tiers').innerHTML = s.tiers.map(tierRow).join('');
    $('#f-on-failure').value = s.on_failure;
  });
  const validate = async () => {
    clearErrors();
    const r = await api('POST', '/v1/console/validate', $('#yaml').value, true);
    if (!r.ok) { showError(r.json); return null; }
    $('#editor-message').innerHTML = '<div class="message good" id="valid">The rule is valid.</div>';
    return r.json;
  };
  $('#validate').addEventListener('click', () => validate().catch(failed));
  $('#preview').addEventListener('click', async () => {
    clearErrors();
    const r = await api('POST', '/v1/console/preview', { rule: $('#yaml').value, minutes: 15 });
    if (!r.ok) { showError(r.json); return; }
    const p = r.json.proposed;
    const c = r.json.current;
    const panel = $('#preview-panel');
    panel.hidden = false;
    const span = p.requests ? `${esc(clock(p.from))} to ${esc(clock(p.to))}` : 'no requests recorded yet';
    panel.innerHTML = `<h2>Impact on the traffic recorded (${span})</h2>
      <div class="cards">
        <div class="card"><div class="label">Requests it matches</div><div class="big" id="preview-matched">${number(p.matched)}</div><div class="sub">of ${number(p.requests)} recorded</div></div>
        <div class="card"><div class="label">It would deny</div><div class="big" id="preview-denied" style="color:var(--denied)">${number(p.denied)}</div><div class="sub">${p.matched ? number((100 * p.denied) / p.matched, 1) : 0}% of those</div></div>
        ${c ? `<div class="card"><div class="label">The rule in use denies</div><div class="big" id="preview-current">${number(c.denied)}</div><div class="sub">of ${number(c.matched)} it matches</div></div>` : ''}
      </div>
      ${p.seconds.length ? chart(p.seconds.map((s) => s[0]), [
    { name: 'offered', color: COLORS.offered, values: p.seconds.map((s) => s[1]) },
    { name: 'admitted', color: COLORS.allowed, values: p.seconds.map((s) => s[2]) },
  ], { title: 'offered and admitted', height: 170 }) : ''}
      ${p.denied_keys.length ? `<h2>Keys it would deny most</h2><table id="preview-keys"><thead><tr><th>Key</th><th class="num">Denied</th></tr></thead><tbody>${p.denied_keys.map(([k, n]) => `<tr><td class="mono">${esc(k)}</td><td class="num">${number(n)}</td></tr>`).join('')}</tbody></table>` : ''}`;
  });
  $('#review').addEventListener('click', async () => {
    const valid = await validate();
    if (!valid) return;
    const proposed = valid.rule;
    const before = current ? toYaml(current) : '';
    const after = toYaml(proposed);
    const panel = $('#review-panel');
    panel.hidden = false;
    panel.innerHTML = `<h2>${current ? 'Changes against the rule in use' : 'The new rule'}</h2>
      <pre class="diff" id="diff">${diff(before, after)}</pre>
      <div class="toolbar"><button type="button" class="primary" id="save">Save ${proposed.shadow ? '(in shadow mode)' : ''}</button>
      ${current ? '<button type="button" class="danger" id="delete-rule">Delete the rule</button>' : ''}</div>`;
    $('#save').addEventListener('click', async () => {
      const r = await api('PUT', `/v1/rules/${encodeURIComponent(proposed.id)}`, $('#yaml').value, true);
      if (!r.ok) { showError(r.json); return; }
      location.hash = `#/rule/${encodeURIComponent(proposed.id)}`;
    });
    $('#delete-rule')?.addEventListener('click', async () => {
      if (!confirm(`Delete the rule ${id}?`)) return;
      const r = await api('DELETE', `/v1/rules/${encodeURIComponent(id)}`);
      if (r.ok) location.hash = '#/rules';
    });
  });
}

// ---- explain ----------------------------------------------------------------------------

async function explain() {
  $('#view').innerHTML = `
    <h1>Explain a decision</h1>
    <p class="muted">What would happen to a request, or to a key under a rule, now: the rules that match, the
      keys they build, what each has left, and the answer the caller would get. Nothing is consumed.</p>
    <div class="row">
      <div class="panel form">
        <h2>A request</h2>
        <div class="field"><label for="x-method">Method</label><input type="text" id="x-method" value="GET"></div>
        <div class="field"><label for="x-path">Path</label><input type="text" id="x-path" value="/"></div>
        <div class="field"><label for="x-headers">Headers (one <code>name: value</code> a line)</label><textarea id="x-headers" rows="3"></textarea></div>
        <div class="field"><label for="x-ip">Client address</label><input type="text" id="x-ip" placeholder="203.0.113.7"></div>
        <div class="field"><label for="x-cost">Cost</label><input type="text" id="x-cost" value="1"></div>
        <button type="button" class="primary" id="explain-request">Explain</button>
      </div>
      <div class="panel form">
        <h2>Or a key under a rule</h2>
        <div class="field"><label for="x-rule">Rule</label><input type="text" id="x-rule"></div>
        <div class="field"><label for="x-key">Key</label><input type="text" id="x-key"></div>
        <button type="button" id="explain-key">Explain</button>
      </div>
    </div>
    <div class="panel" id="explain-result" hidden></div>`;
  const show = (r) => {
    const panel = $('#explain-result');
    panel.hidden = false;
    if (!r.ok) { panel.innerHTML = `<div class="message bad">${esc(r.json?.error)}</div>`; return; }
    const x = r.json;
    const rows = x.matches.map((m) => `<tr data-rule="${esc(m.rule)}"><td class="mono">${esc(m.rule)}${m.shadow ? ' <span class="badge warn">shadow</span>' : ''}</td><td class="mono" title="${esc(m.key)}">${esc(m.display || m.key)}</td><td>${esc(m.algorithm)}<br><span class="muted">${tiersText(m.tiers)}</span></td><td class="num">${number(m.remaining)} of ${number(m.limit)}<br><span class="muted">tier ${m.binding_tier + 1}</span></td><td class="num">${number(m.reset_after_s, 1)} s</td><td>${m.would_admit ? '<span class="badge good">admits</span>' : '<span class="badge bad">denies</span>'}</td></tr>`).join('');
    const headers = Object.entries(x.headers).map(([k, v]) => `<tr><td class="mono">${esc(k)}</td><td class="mono">${esc(v)}</td></tr>`).join('');
    panel.innerHTML = `<h2>The answer: <span id="explain-status" class="${x.allowed ? 'ok' : 'error'}">${x.status} ${x.allowed ? 'admitted' : 'Too Many Requests'}</span> <span class="muted">(a cost of ${number(x.cost)}; nothing was consumed)</span></h2>
      <table id="explain-matches"><thead><tr><th>Rule</th><th>Key</th><th>Algorithm and tiers</th><th class="num">Left now</th><th class="num">Full again in</th><th></th></tr></thead>
      <tbody>${rows || '<tr><td colspan="6" class="muted">No rule matches: admitted, unlimited.</td></tr>'}</tbody></table>
      ${headers ? `<h2 style="margin-top:1rem">Headers the caller would get</h2><table id="explain-headers"><tbody>${headers}</tbody></table>` : ''}`;
  };
  $('#explain-request').addEventListener('click', async () => {
    const headers = {};
    for (const line of $('#x-headers').value.split('\n')) {
      const i = line.indexOf(':');
      if (i > 0) headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
    }
    const request = { method: $('#x-method').value.trim(), path: $('#x-path').value.trim(), headers };
    const ip = $('#x-ip').value.trim();
    if (ip) request.client_ip = ip;
    show(await api('POST', '/v1/console/explain', { request, cost: Number($('#x-cost').value) || 1 }));
  });
  $('#explain-key').addEventListener('click', async () => {
    show(await api('POST', '/v1/console/explain', { rule: $('#x-rule').value.trim(), key: $('#x-key').value }));
  });
}

// ---- plans (overrides) ------------------------------------------------------------------

function expiresText(at) {
  if (!at) return 'never';
  return new Date(at * 1000).toLocaleString('en-GB');
}

// Each tenant's plan: a rule's tiers for one key or a pattern of keys (`acme-*`), set without
// a reload. Not refreshed by itself, so that the form keeps what is being typed.
async function plans(only) {
  const [listed, ruled] = await Promise.all([api('GET', '/v1/overrides'), api('GET', '/v1/console/rules')]);
  const natives = ruled.json.rules.filter((r) => r.source !== 'envoy').map((r) => r.id);
  const all = listed.json.overrides.filter((o) => !only || o.rule === only);
  const rows = all.map((o) => `<tr data-rule="${esc(o.rule)}" data-key="${esc(o.key)}">
      <td class="mono">${esc(o.rule)}</td><td class="mono">${esc(o.key)}</td><td>${tiersText(o.tiers)}</td>
      <td>${esc(expiresText(o.expires_at))}</td>
      <td><button type="button" class="edit-plan">Edit</button> <button type="button" class="danger delete-plan">Delete</button></td></tr>`).join('');
  const options = natives.map((id) => `<option value="${esc(id)}"${id === only ? ' selected' : ''}>${esc(id)}</option>`).join('');
  $('#view').innerHTML = `
    <h1>Plans${only ? ` of <span class="mono">${esc(only)}</span>` : ''}</h1>
    <p class="muted">A plan replaces a rule's tiers for one key, or for the keys a pattern matches (<code>*</code>: any run of
      characters); the key exactly first, then the most specific pattern. Each plan counts apart from the rule, is
      kept across reloads and restarts, and reaches every instance on one Redis within a second.${only ? ' <a href="#/plans">Every rule\'s plans</a>.' : ''}</p>
    <div class="panel"><table id="plans"><thead><tr><th>Rule</th><th>Key or pattern</th><th>Tiers</th><th>Ends</th><th></th></tr></thead>
      <tbody>${rows || '<tr><td colspan="5" class="muted">No plan set: every key has its rule\'s tiers.</td></tr>'}</tbody></table></div>
    <div class="panel form"><h2>Set a plan</h2>
      <div class="field"><label for="p-rule">Rule</label><select id="p-rule">${options}</select></div>
      <div class="field"><label for="p-key">Key or pattern</label><input type="text" id="p-key" placeholder="acme or acme-*"></div>
      <div class="field"><label for="p-limit">Limit</label><input type="text" id="p-limit" placeholder="5000"></div>
      <div class="field"><label for="p-period">Period</label><input type="text" id="p-period" placeholder="1h"></div>
      <div class="field"><label for="p-burst">Burst (buckets; optional)</label><input type="text" id="p-burst"></div>
      <div class="field"><label for="p-expires">Ends after (optional: 30d, 12h)</label><input type="text" id="p-expires"></div>
      <button type="button" class="primary" id="save-plan">Save</button> <span id="plan-message"></span>
    </div>`;
  const say = (r, what) => {
    $('#plan-message').innerHTML = r.ok ? `<span class="ok">${esc(what)}</span>` : `<span class="error">${esc(r.json?.error)}</span>`;
  };
  $('#save-plan').addEventListener('click', async () => {
    const rule = $('#p-rule').value;
    const key = $('#p-key').value.trim();
    if (!key) { $('#plan-message').innerHTML = '<span class="error">Give a key or a pattern.</span>'; return; }
    const tier = { limit: Number($('#p-limit').value.trim()), period: $('#p-period').value.trim() };
    const burst = $('#p-burst').value.trim();
    if (burst) tier.burst = Number(burst);
    const body = { tiers: [tier] };
    const expires = $('#p-expires').value.trim();
    if (expires) body.expires = expires;
    const r = await api('PUT', `/v1/overrides/${encodeURIComponent(rule)}/${encodeURIComponent(key)}`, body);
    if (r.ok) { await plans(only); }
    say(r, `Saved the plan of ${key} under ${rule}.`);
  });
  $$('button.edit-plan').forEach((b) => b.addEventListener('click', () => {
    const row = b.closest('tr');
    const plan = all.find((o) => o.rule === row.dataset.rule && o.key === row.dataset.key);
    $('#p-rule').value = plan.rule;
    $('#p-key').value = plan.key;
    $('#p-limit').value = plan.tiers[0].limit;
    $('#p-period').value = plan.tiers[0].period;
    $('#p-burst').value = plan.tiers[0].burst ?? '';
    $('#p-key').focus();
  }));
  $$('button.delete-plan').forEach((b) => b.addEventListener('click', async () => {
    const row = b.closest('tr');
    if (!confirm(`Delete the plan of ${row.dataset.key} under ${row.dataset.rule}?`)) return;
    const r = await api('DELETE', `/v1/overrides/${encodeURIComponent(row.dataset.rule)}/${encodeURIComponent(row.dataset.key)}`);
    if (r.ok) { await plans(only); }
    say(r, `Deleted the plan of ${row.dataset.key} under ${row.dataset.rule}.`);
  }));
}

// ---- lists (allow, deny, bans) -----------------------------------------------------------

// Keys that bypass a rule or are refused before it, and the bans rules made. Not refreshed by
// itself, so that the form keeps what is being typed.
async function lists() {
  const [listed, ruled] = await Promise.all([api('GET', '/v1/lists'), api('GET', '/v1/console/rules')]);
  const ids = ruled.json.rules.map((r) => r.id);
  const rows = listed.json.entries.map((e) => `<tr data-list="${esc(e.list)}" data-rule="${esc(e.rule)}" data-key="${esc(e.key)}">
      <td>${e.list === 'deny' ? '<span class="badge bad">deny</span>' : '<span class="badge good">allow</span>'}</td>
      <td class="mono">${esc(e.rule === '*' ? 'every rule' : e.rule)}</td><td class="mono">${esc(e.key)}</td>
      <td>${esc(e.expires_at_ms ? new Date(e.expires_at_ms).toLocaleString('en-GB') : 'never')}</td>
      <td>${e.list === 'deny' ? esc(String(e.status ?? 429)) : ''}</td><td>${esc(e.reason ?? '')}</td>
      <td><button type="button" class="danger delete-entry">Delete</button></td></tr>`).join('');
  const options = ['*', ...ids].map((id) => `<option value="${esc(id)}">${esc(id === '*' ? 'every rule' : id)}</option>`).join('');
  $('#view').innerHTML = `
    <h1>Lists</h1>
    <p class="muted">Checked before the rules: an allowed key bypasses its rule (counting nothing), a denied key is
      refused (nothing counted, <code>Retry-After</code> until the entry ends). A rule's <code>ban</code> puts a key that
      exceeds it on the deny list. Kept across restarts; every instance on one Redis applies an edit within a second.</p>
    <div class="panel"><table id="lists"><thead><tr><th>List</th><th>Rule</th><th>Key</th><th>Ends</th><th>Status</th><th>Why</th><th></th></tr></thead>
      <tbody>${rows || '<tr><td colspan="7" class="muted">No entry: every key goes to its rules.</td></tr>'}</tbody></table></div>
    <div class="panel form"><h2>Add an entry</h2>
      <div class="field"><label for="l-list">List</label><select id="l-list"><option value="deny">deny</option><option value="allow">allow</option></select></div>
      <div class="field"><label for="l-rule">Rule</label><select id="l-rule">${options}</select></div>
      <div class="field"><label for="l-key">Key (as the rule pages show it)</label><input type="text" id="l-key" placeholder="acme"></div>
      <div class="field"><label for="l-expires">Ends after (optional: 10m, 30d)</label><input type="text" id="l-expires"></div>
      <div class="field"><label for="l-status">Deny status</label><select id="l-status"><option value="429">429</option><option value="403">403</option></select></div>
      <div class="field"><label for="l-reason">Why (optional)</label><input type="text" id="l-reason"></div>
      <button type="button" class="primary" id="save-entry">Save</button> <span id="list-message"></span>
    </div>`;
  const say = (r, what) => {
    $('#list-message').innerHTML = r.ok ? `<span class="ok">${esc(what)}</span>` : `<span class="error">${esc(r.json?.error)}</span>`;
  };
  $('#save-entry').addEventListener('click', async () => {
    const list = $('#l-list').value;
    const rule = $('#l-rule').value;
    const key = $('#l-key').value.trim();
    if (!key) { $('#list-message').innerHTML = '<span class="error">Give a key.</span>'; return; }
    const body = {};
    const expires = $('#l-expires').value.trim();
    if (expires) body.expires = expires;
    if (list === 'deny') body.status = Number($('#l-status').value);
    const reason = $('#l-reason').value.trim();
    if (reason) body.reason = reason;
    const r = await api('PUT', `/v1/lists/${list}/${encodeURIComponent(rule)}/${encodeURIComponent(key)}`, body);
    if (r.ok) { await lists(); }
    say(r, `Put ${key} on the ${list} list.`);
  });
  $$('button.delete-entry').forEach((b) => b.addEventListener('click', async () => {
    const row = b.closest('tr');
    if (!confirm(`Take ${row.dataset.key} off the ${row.dataset.list} list?`)) return;
    const r = await api('DELETE', `/v1/lists/${row.dataset.list}/${encodeURIComponent(row.dataset.rule)}/${encodeURIComponent(row.dataset.key)}`);
    if (r.ok) { await lists(); }
    say(r, `Took ${row.dataset.key} off the ${row.dataset.list} list.`);
  }));
}

// ---- audit ------------------------------------------------------------------------------

async function audit() {
  const r = await api('GET', '/v1/console/audit');
  const rows = r.json.audit.map((a) => `<tr><td>${esc(new Date(a.at * 1000).toLocaleString('en-GB'))}</td><td>${esc(a.action)}</td><td class="mono">${esc(a.rule)}</td><td class="mono" title="${esc(a.key ?? '')}">${esc(a.display ?? '')}</td><td class="mono">${esc(a.by)}</td></tr>`).join('');
  $('#view').innerHTML = `<h1>Audit</h1><div class="panel"><table id="audit"><thead><tr><th>When</th><th>Action</th><th>Rule</th><th>Key</th><th>By</th></tr></thead>
    <tbody>${rows || '<tr><td colspan="5" class="muted">No admin action yet.</td></tr>'}</tbody></table></div>`;
  again(audit);
}

// ---- start ------------------------------------------------------------------------------

window.addEventListener('hashchange', route);
document.addEventListener('DOMContentLoaded', () => {
  $('#login-button').addEventListener('click', signIn);
  $('#token').addEventListener('keydown', (e) => { if (e.key === 'Enter') signIn(); });
  $('#logout').addEventListener('click', () => signOut('Signed out.'));
  if (sessionStorage.getItem(TOKEN)) {
    $('#bar').hidden = false;
    route();
  } else {
    signOut('');
  }
});
