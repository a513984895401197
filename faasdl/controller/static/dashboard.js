// faasdl's dashboard: the job list, and a job followed live through its event stream.
// Everything is read through the API with the key kept in this browser session; nothing is
// written into the page as HTML (text nodes only), so no job data can inject markup.
"use strict";

const KEY = "faasdl-api-key";
const FILTER = "faasdl-job-filter"; // the job list's filters, kept across a reload
const SVG = "http://www.w3.org/2000/svg";
const LANE_H = 26;
const LEFT = 96;
const RIGHT = 24;
// The lanes draw a job's latest rounds (its curves keep every round): a 1,000-round job's lanes
// would be too dense to read, and its whole ledger (some 6,000 lines) too much to fetch at each
// burst of events.
const LANE_ROUNDS = 20;
// How many times a model's download cut short goes on from where it stopped (the client's
// DOWNLOAD_RESUMES).
const DOWNLOAD_RESUMES = 3;
// The bytes of a model gathered into a Blob (where the page cannot write a file) put in at once.
const GATHER_BYTES = 16 * 1024 * 1024;
const $ = (selector) => document.querySelector(selector);

let following = null; // the AbortController of the job being followed
let listTimer = null;
let listAsked = 0; // the job list's requests: only the latest one's answer is shown
let refreshTimer = null;
// {id, view, lines: the ledger's lines read, by activation id; rounds: its rounds read, by number}
let current = null;

// ---- small helpers ------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  node.append(...children);
  return node;
}

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  node.append(...children);
  return node;
}

function titled(node, text) {
  node.append(svg("title", {}, text));
  return node;
}

const fmt = (x, digits = 3) => (x === null || x === undefined ? "–" : Number(x).toFixed(digits));
const clock = (ms) => new Date(ms).toLocaleTimeString();
const say = (text) => { $("#key-status").textContent = text; };

function key() {
  return sessionStorage.getItem(KEY);
}

// A controller with authentication off (FAASDL_API__AUTH=none, as in `faasdl demo`; the page
// says so in body[data-auth]) needs no key. `extra`: headers besides the key's (a Range).
async function api(path, signal, extra = {}) {
  const headers = { ...extra, ...(key() ? { Authorization: `Bearer ${key()}` } : {}) };
  // Not from the browser's cache: a job's view changes, and a Range's part is the model's now.
  const response = await fetch(path, { headers, signal, cache: "no-store" });
  if (response.status === 401) {
    const had = Boolean(key());
    sessionStorage.removeItem(KEY);
    // Why it was refused, as the API says it (an expired key says when it expired).
    const why = await detail(response);
    say(had ? `the key was refused${why ? ` (${why})` : ""}: enter another`
      : "enter an API key to see your jobs");
    throw new Error("unauthenticated");
  }
  if (!response.ok) {
    const why = await detail(response);
    throw new Error(`${path} answered ${response.status}${why ? `: ${why}` : ""}`);
  }
  return response;
}

// The problem's detail an error answer gives (a text), or null.
const detail = (response) => response.json()
  .then((body) => (typeof body.detail === "string" ? body.detail : null), () => null);

// ---- routing ------------------------------------------------------------------------------

function stop() {
  if (following) following.abort();
  following = null;
  clearInterval(listTimer);
  clearTimeout(refreshTimer);
  refreshTimer = null;
}

function route() {
  stop();
  const match = location.hash.match(/^#job=([0-9a-zA-Z_-]+)$/);
  $("#jobs-view").hidden = Boolean(match);
  $("#job-view").hidden = !match;
  if (!key() && document.body.dataset.auth !== "none") {
    say("enter an API key to see your jobs");
    $("#jobs tbody").replaceChildren();
    return;
  }
  if (match) openJob(match[1]);
  else openList();
}

// ---- the job list -------------------------------------------------------------------------

function openList() {
  refreshList();
  listTimer = setInterval(refreshList, 2000);
}

// The filters the list is asked with: the name's words (those the job's name holds) and the
// state, where given.
function listFilters() {
  const filters = new URLSearchParams();
  const name = $("#filter-name").value;
  if (name) filters.set("name", name);
  if ($("#filter-state").value) filters.set("state", $("#filter-state").value);
  return filters;
}

// The filters changed: kept for this browser session (a reload asks with them), and asked with.
function filtersChanged() {
  const kept = { name: $("#filter-name").value, state: $("#filter-state").value };
  sessionStorage.setItem(FILTER, JSON.stringify(kept));
  refreshList();
}

async function refreshList() {
  const asked = ++listAsked;
  const filters = listFilters();
  let jobs, more;
  try {
    const response = await api(filters.size ? `/v1/jobs?${filters}` : "/v1/jobs");
    more = response.headers.has("Link"); // a next page: older jobs than these
    jobs = await response.json();
  } catch (error) {
    if (asked !== listAsked) return; // a newer request's answer is, or will be, shown
    if (error.message !== "unauthenticated") say(error.message);
    $("#jobs tbody").replaceChildren();
    return;
  }
  if (asked !== listAsked) return; // filters changed while it was asked for
  const rows = jobs.map((job) => {
    const progress = el("progress", {
      max: String(job.rounds), value: String(job.round), "aria-label": `${job.job_id} progress`,
    });
    return el("tr", { "data-job": job.job_id },
      el("td", {}, el("a", { href: `#job=${job.job_id}` }, job.job_id),
        ...(job.name ? [" ", el("span", { class: "name" }, job.name)] : [])),
      el("td", { class: `state state-${job.state}` }, job.state),
      el("td", {}, job.tenant),
      el("td", {}, progress, ` ${job.round}/${job.rounds}`),
      el("td", { class: "num" }, fmt(job.loss)),
      el("td", { class: "num" }, fmt(job.accuracy)),
      el("td", { class: "num" }, fmt(job.cost_usd, 6)),
      el("td", {}, clock(job.created_ms)));
  });
  // The rows are rebuilt every refresh: a keyboard user's focus stays on the job it was on.
  const focused = document.activeElement?.closest("#jobs tbody tr")?.dataset.job;
  $("#jobs tbody").replaceChildren(...rows);
  if (focused) $(`#jobs tbody tr[data-job="${CSS.escape(focused)}"] a`)?.focus();
  const which = filters.size ? " that match" : "";
  if (!jobs.length) say(filters.size ? "no jobs match" : "no jobs yet");
  else say(more ? `the ${jobs.length} newest jobs${which}` : "");
}

// ---- one job ------------------------------------------------------------------------------

function openJob(id) {
  current = { id, view: null, lines: new Map(), rounds: new Map() };
  $("#job-title").textContent = `Job ${id}`;
  $("#job-model").hidden = true;
  $("#model-progress").textContent = "";
  for (const part of ["#job-summary", "#lanes", "#curves", "#memory tbody", "#events"]) {
    $(part).replaceChildren();
  }
  following = new AbortController();
  refreshJob();
  followEvents(id, following.signal);
}

function soon() {
  if (refreshTimer === null) {
    refreshTimer = setTimeout(() => { refreshTimer = null; refreshJob(); }, 200);
  }
}

// A running job's rounds are read from its last finished one on, and its ledger from the round
// before the lanes' first on, each merged into what was read before (a line booked late for an
// older round, outside the lanes, is read once the job has ended); a job not running, in full
// (with the lines booked as it ended).
const active = (job) => job.view !== null && ["running", "queued"].includes(job.view.job.state);
const roundsFrom = (job) => (active(job) ? Math.max(0, job.view.job.round - 1) : 0);
const ledgerFrom = (job) => (active(job) ? Math.max(0, job.view.job.round - LANE_ROUNDS) : 0);

async function refreshJob() {
  const job = current;
  const signal = following ? following.signal : undefined;
  const after = roundsFrom(job);
  const from = ledgerFrom(job);
  try {
    const [view, ledger] = await Promise.all([
      api(`/v1/jobs/${job.id}?round_from=${after}`, signal).then((r) => r.json()),
      api(`/v1/jobs/${job.id}/ledger?round_from=${from}`, signal).then((r) => r.json()),
    ]);
    if (job !== current) return;
    if (after === 0) job.rounds.clear();
    for (const round of view.job.rounds) job.rounds.set(round.round, round);
    view.job.rounds = [...job.rounds.values()].sort((a, b) => a.round - b.round);
    job.view = view;
    if (from === 0) job.lines.clear();
    for (const line of ledger) job.lines.set(line.activation_id, line);
    render(job);
    if ((after > 0 || from > 0) && !active(job)) soon(); // it has just ended: read it whole
  } catch (error) {
    if (error.name !== "AbortError" && error.message !== "unauthenticated") say(error.message);
  }
}

// The event stream: one refresh per burst of events; reconnects until the job has ended (an
// EventSource cannot send the bearer token, so the stream is read with fetch).
async function followEvents(id, signal) {
  while (!signal.aborted) {
    let ended = false;
    try {
      const response = await api(`/v1/jobs/${id}/events`, signal);
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          if (block.startsWith(":")) continue; // a keep-alive
          if (/^event: end$/m.test(block)) ended = true;
          soon();
        }
      }
    } catch (error) {
      if (signal.aborted || error.message === "unauthenticated") return;
      say(`event stream: ${error.message}; reconnecting`);
    }
    if (ended) return;
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

function render(job) {
  const view = job.view;
  const ledger = [...job.lines.values()].sort((a, b) => a.start_ms - b.start_ms);
  renderSummary(view);
  renderLanes(view, ledger);
  renderCurves(view.job.rounds);
  renderMemory(view.job.plan, ledger);
  const replicas = view.replicas;
  $("#replicas").textContent = replicas
    ? `${replicas.ready} ready of ${replicas.wanted} wanted (${replicas.runtime})`
    : "none";
  const events = view.job.events.map((event) => el("li", { class: event.kind },
    el("time", {}, clock(event.t_ms)), " ", el("span", { class: "kind" }, event.kind), " ",
    event.message));
  $("#events").replaceChildren(...events);
}

function renderSummary(view) {
  const job = view.job;
  const named = job.spec.name ? `: ${job.spec.name}` : "";
  $("#job-title").textContent = `Job ${job.job_id}${named}`;
  const last = job.rounds[job.rounds.length - 1];
  const rounds = job.plan ? job.plan.rounds : "?";
  const facts = [
    ["State", job.state, `state state-${job.state}`],
    ["Tenant", job.tenant],
    ["Model", view.model_called],
    ["Rounds", `${job.round}/${rounds}`],
    ["Workers", job.plan ? job.plan.train.containers : "?"],
    ["Loss", last ? fmt(last.test_loss) : "–"],
    ["Accuracy", last ? fmt(last.accuracy) : "–"],
    ["Failures", job.failures.length + job.failures_dropped],
    ["Activations", job.activation_count],
    ["Cost (USD)", fmt(job.cost_usd, 6)
      + (job.spec.max_cost_usd ? ` of its ${job.spec.max_cost_usd} budget` : "")
      + (job.plan && job.plan.expected_cost_usd != null
        ? ` (its actions ${fmt(job.plan.expected_cost_usd, 6)} by past runs`
          + (job.plan.expected_cost_cold_usd != null
            ? `, ${fmt(job.plan.expected_cost_cold_usd, 6)} with its containers' cold starts)`
            : ")")
        : job.plan && job.plan.train_cost_usd != null
          ? ` (its training ${fmt(job.plan.train_cost_usd, 6)} by past runs)` : "")],
  ];
  if (last && last.validation_loss != null) {
    facts.splice(6, 0, ["Validation loss", fmt(last.validation_loss)]);
  }
  if (job.spec.keep_model === "best" && job.best) {
    const validated = job.best.validation_loss != null;
    facts.push(["Kept model", `round ${job.best.round}'s, of its lowest `
      + `${validated ? "validation" : "test"} loss `
      + `(${fmt(validated ? job.best.validation_loss : job.best.test_loss)}, `
      + `test accuracy ${fmt(job.best.accuracy)})`]);
  }
  if (view.queue_position !== null) facts.push(["Queue position", view.queue_position]);
  if (view.waiting_for) facts.push(["Waiting for", view.waiting_for]);
  if (job.error) facts.push(["Error", job.error]);
  $("#job-summary").replaceChildren(...facts.map(([name, value, cls]) => el("div", {},
    el("dt", {}, name), el("dd", cls ? { class: cls, id: `summary-${name.toLowerCase()}` } : {},
      String(value)))));
  // The model the job kept: a done job's, or the last finished round's of one that failed or
  // was cancelled. The button stays one element (a keyboard user's focus is not lost).
  $("#job-model").hidden = !job.model;
  $("#model-note").textContent = job.state === "done"
    ? "(safetensors; faasdl.training.models.load_model builds it)"
    : `of round ${job.round}, the last this ${job.state} job finished`;
}

// The model is read with the key (a link cannot send it), its bytes counted beside the button;
// one cut short goes on from where it stopped (receive). Where the browser can write a file as
// it arrives (the File System Access API, Chromium's), it goes to the file the user picks: a
// model is never held whole in the page (VGG16's with Adam's moments is ~1.6 GB), and one that
// cannot be had whole is dropped (the browser writes a copy, moved in place only once whole).
// Elsewhere it is gathered into a Blob and handed over as a file once whole.
async function downloadModel() {
  const id = current && current.id;
  if (!id) return;
  const name = `${id}.safetensors`;
  const progress = $("#model-progress");
  let file = null;
  let into = null;
  try {
    // The picker first, while the click still counts as the user's: then the request.
    if (window.showSaveFilePicker) {
      const accept = { "application/octet-stream": ".safetensors" };
      file = await window.showSaveFilePicker({
        suggestedName: name,
        types: [{ description: "safetensors", accept }],
      });
    }
    progress.textContent = `downloading ${name}`;
    into = file ? await file.createWritable() : new Gathered();
    const got = await receive(`/v1/jobs/${id}/model`, name, into, progress);
    await into.close();
    if (file) progress.textContent = `saved ${file.name} (${mb(got)})`;
    else {
      hand(into.blob, name);
      progress.textContent = `handed ${name} to the browser (${mb(got)})`;
    }
  } catch (error) {
    if (error.name === "AbortError" && !into) return; // the file picker closed without a file
    if (into) await into.abort().catch(() => {}); // a file picked is left as it was
    if (error.message === "unauthenticated") { // the key's box says so
      progress.textContent = "";
      return;
    }
    progress.textContent = `the download stopped (${error.message}): ${file ? file.name : name} ` +
      "was not written; download it again";
  }
}

// A model's bytes gathered into a Blob as they come (a writable's methods, as receive writes
// to): the parts not yet in it are put in at each GATHER_BYTES, the Blob made of the Blob before
// and them, so that the page does not hold the model twice as the Blob is made.
class Gathered {
  constructor() {
    this.blob = new Blob([], { type: "application/octet-stream" });
    this.parts = [];
    this.held = 0;
  }

  async write(piece) {
    this.parts.push(piece);
    this.held += piece.byteLength;
    if (this.held >= GATHER_BYTES) this.settle();
  }

  settle() {
    this.blob = new Blob([this.blob, ...this.parts], { type: "application/octet-stream" });
    this.parts = [];
    this.held = 0;
  }

  async close() {
    this.settle();
  }

  async abort() {
    this.blob = null;
    this.parts = [];
  }
}

function hand(blob, name) {
  const url = URL.createObjectURL(blob);
  const link = el("a", { href: url, download: name, hidden: "" });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000); // the download has begun by then
}

// Write the model at `path` into `writable` as it arrives, its bytes counted in `progress`;
// the bytes written. An answer cut short goes on from what was written of it, up to
// DOWNLOAD_RESUMES times, asking for the rest of the same model (Range, and If-Range its ETag),
// as `faasdl model` does: a large model is not downloaded again from its start. (Chromium drops
// what it holds unread of an answer that fails, so what was written may be less than came, or
// nothing: that is why a try that wrote nothing counts too.)
async function receive(path, name, writable, progress) {
  let got = 0;
  let shown = 0;
  let size = null;
  let tag = null;
  for (let resumes = 0; ; resumes += 1) {
    const rest = resumes ? { Range: `bytes=${got}-`, "If-Range": tag } : {};
    const response = await api(path, undefined, rest);
    if (resumes && response.status !== 206) {
      throw new Error(`the controller stopped sending the model after ${mb(got)}, and then ` +
        "sent another one");
    }
    if (!resumes) {
      tag = response.headers.get("ETag");
      size = Number(response.headers.get("Content-Length")) || null;
    }
    const of = size ? ` of ${mb(size)}` : "";
    const reader = response.body.getReader();
    for (;;) {
      let piece;
      try {
        piece = await reader.read();
      } catch (error) { // the connection lost: go on from what was written
        if (!tag || resumes === DOWNLOAD_RESUMES) throw error;
        progress.textContent = `downloading ${name}: ${mb(got)}${of}, going on after the ` +
          `download stopped (${error.message})`;
        break;
      }
      if (piece.done) return got;
      await writable.write(piece.value);
      got += piece.value.byteLength;
      if (got - shown >= (size || 0) / 100 || got === size) { // a hundred updates at most
        shown = got;
        progress.textContent = `downloading ${name}: ${mb(got)}${of}`;
      }
    }
  }
}

const mb = (bytes) => `${fmt(bytes / 1e6, 1)} MB`;

// One lane per training unit (a shard: the same lane across rounds) and one for aggregation and
// evaluation; each activation is a bar (queue wait, cold start, training) ending in a commit or
// a failure; failures as the controller noticed them, running attempts and their checkpoints.
function renderLanes(view, ledger) {
  const job = view.job;
  const workers = job.plan ? job.plan.train.containers : 0;
  const roundStart = (round) => {
    const started = job.events.filter((e) => e.kind === "round_started" && e.round === round);
    return started.length ? started[started.length - 1].t_ms : null;
  };
  // The latest LANE_ROUNDS rounds: the one in progress and those before it.
  const last = ledger.reduce((top, l) => Math.max(top, l.round),
    job.state === "running" ? job.round : 0);
  const first = Math.max(0, last - LANE_ROUNDS + 1);
  const drawn = ledger.filter((l) => l.round >= first);
  const earliest = Math.min(roundStart(first) ?? Infinity,
    ...drawn.map((l) => l.start_ms - l.wait_ms));
  const start = first > 0 && Number.isFinite(earliest)
    ? earliest
    : job.started_ms || job.created_ms;
  const end = job.finished_ms || Date.now();
  const width = Math.max(720, $("#lanes").clientWidth - 2);
  const span = Math.max(1000, end - start);
  const x = (t) => LEFT + ((Math.max(t, start) - start) / span) * (width - LEFT - RIGHT);
  const laneOf = (kind, unit) => (kind === "train" ? unit : workers);
  const y = (lane) => 20 + lane * LANE_H;
  const chart = svg("svg", { width, height: y(workers + 1) + 8, "data-kind": "lanes" });

  for (let lane = 0; lane <= workers; lane += 1) {
    const label = lane < workers ? `shard ${lane}` : "aggregation";
    chart.append(svg("g", { "data-kind": "lane", "data-unit": lane < workers ? lane : "agg" },
      svg("text", { x: 8, y: y(lane) + 15 }, label),
      svg("line", { class: "axis", x1: LEFT, x2: width - RIGHT, y1: y(lane) + 22, y2: y(lane) + 22 })));
  }
  const seconds = Math.round(span / 1000);
  chart.append(svg("text", { x: width - RIGHT, y: 12, "text-anchor": "end" }, `${seconds} s`));
  if (first > 0) {
    const rounds = job.plan ? job.plan.rounds : "?";
    chart.append(svg("text", { x: LEFT, y: 12, "data-kind": "window" },
      `rounds ${first + 1}–${last + 1} of ${rounds}`));
  }

  for (const line of drawn) {
    const lane = laneOf(line.kind, line.unit);
    const top = y(lane) + 4;
    const t = line.start_ms;
    const group = svg("g", {
      "data-kind": "activation", "data-unit": line.kind === "train" ? line.unit : "agg",
      "data-round": line.round, "data-attempt": line.attempt, "data-outcome": line.outcome,
    });
    const peak = line.peak_memory_mb === null ? "unmeasured" : `${fmt(line.peak_memory_mb, 0)} MB`;
    titled(group, `${line.kind} round ${line.round + 1}, attempt ${line.attempt}: ${line.outcome}`
      + ` · ${line.duration_ms} ms (wait ${line.wait_ms}, cold start ${line.init_ms})`
      + ` · ${line.memory_mb} MB limit, peak ${peak}`);
    const bar = (cls, from, to) => group.append(svg("rect", {
      class: cls, x: x(from), y: top, height: 14, width: Math.max(1.5, x(to) - x(from)),
    }));
    if (line.wait_ms > 0) bar("wait", t - line.wait_ms, t);
    if (line.init_ms > 0) bar("init", t, t + line.init_ms);
    bar("run", t + line.init_ms, t + line.duration_ms);
    const stop = x(t + line.duration_ms);
    if (line.outcome === "success") {
      if (line.kind === "train") {
        group.append(svg("text", { class: "commit", x: stop + 2, y: top + 12 }, "✓"));
      }
    } else {
      // Stopped by a cancel or its job's failure: not a failure of its own.
      const cls = line.outcome === "stopped" ? "stopped" : "failure";
      group.append(svg("rect", { class: cls, x: stop - 3, y: top - 2, width: 3, height: 18 }));
    }
    if (line.kind === "train" && line.attempt > 1 && line.init_ms === 0) {
      group.append(svg("text", { class: "replica", x: x(t) - 10, y: top + 12 }, "R"));
    }
    chart.append(group);
  }

  // An ended job's unit records may still say running (a cancel stops the attempts, not them).
  const live = job.state === "running" ? view.units : [];
  for (const unit of live.filter((u) => u.state === "running")) {
    const failed = job.failures.filter((f) => f.kind === "train" && f.round === unit.round
      && f.unit === unit.shard);
    // From its attempt's claim (a record from before it had one: its round's start, its last
    // failure).
    const from = unit.claimed_ms
      ?? Math.max(roundStart(unit.round) ?? start, ...failed.map((f) => f.t_ms));
    const top = y(unit.shard) + 4;
    const group = titled(svg("g", {
      "data-kind": "running", "data-unit": unit.shard, "data-round": unit.round,
      "data-attempt": unit.attempts,
    }), `round ${unit.round + 1}, attempt ${unit.attempts}: running`
      + (unit.host ? ` in ${unit.host}` : ""));
    group.append(svg("rect", {
      class: "running", x: x(from), y: top, height: 14, width: Math.max(1.5, x(end) - x(from)),
    }));
    for (const head of unit.heads) {
      group.append(titled(svg("text", {
        class: "checkpoint", x: x(head.created_ms) - 4, y: top + 12, "data-kind": "checkpoint",
      }, "◆"), `checkpoint at position ${head.position} (${head.size} bytes)`));
    }
    chart.append(group);
  }
  for (const failure of job.failures.filter((f) => f.kind === "train" && f.round >= first)) {
    const top = y(failure.unit) + 4;
    chart.append(titled(svg("text", {
      class: "failure", x: x(failure.t_ms) - 6, y: top + 13, "font-size": 16, "data-kind": "failure",
      "data-unit": failure.unit, "data-round": failure.round, "data-attempt": failure.attempt,
    }, "✕"), `attempt ${failure.attempt}: ${failure.classification} (seen by the `
      + `${failure.detected_by}): ${failure.message}; ${failure.recovery}`
      + (failure.resume_from !== null ? ` from checkpoint ${failure.resume_from}` : "")));
  }
  $("#lanes").replaceChildren(chart);
}

// Training loss, test loss, validation loss where the job holds a validation set out (left axis)
// and test accuracy (right axis, 0–1), a point per round.
function renderCurves(rounds) {
  const width = Math.max(480, Math.min(900, $("#curves").clientWidth - 2));
  const height = 220;
  const pad = 40;
  const chart = svg("svg", { width, height, "data-kind": "curves" });
  if (!rounds.length) {
    chart.append(svg("text", { x: pad, y: height / 2 }, "no round has finished yet"));
    $("#curves").replaceChildren(chart);
    return;
  }
  const validated = rounds.some((r) => r.validation_loss != null);
  const losses = rounds.flatMap((r) => [r.loss, r.test_loss, r.validation_loss ?? 0]);
  const top = Math.max(1e-9, ...losses);
  const plot = width - 2 * pad - 160; // room for the legend on the right
  const px = (i) => pad + (rounds.length > 1 ? i / (rounds.length - 1) : 0.5) * plot;
  const py = (v, max) => height - pad - (v / max) * (height - 2 * pad);
  chart.append(
    svg("line", { class: "axis", x1: pad, x2: pad + plot, y1: height - pad, y2: height - pad }),
    svg("text", { x: 4, y: pad - 8 }, `loss 0–${fmt(top, 2)}, accuracy 0–1`),
    svg("text", { x: pad, y: height - 12 }, "round 1"),
    svg("text", { x: pad + plot, y: height - 12, "text-anchor": "end" }, `round ${rounds.length}`));
  const series = [
    ["loss", (r) => r.loss, top, "training loss"],
    ["test-loss", (r) => r.test_loss, top, "test loss"],
    ...(validated ? [["validation-loss", (r) => r.validation_loss, top, "validation loss"]] : []),
    ["accuracy", (r) => r.accuracy, 1, "test accuracy"],
  ];
  series.forEach(([cls, , , name], i) => chart.append(
    svg("line", { class: cls, x1: width - 150, x2: width - 130, y1: pad + 8 + i * 18, y2: pad + 8 + i * 18 }),
    svg("text", { x: width - 124, y: pad + 12 + i * 18 }, name)));
  for (const [cls, value, max, name] of series) {
    const scored = rounds.map((r, i) => [r, i]).filter(([r]) => value(r) != null);
    const points = scored.map(([r, i]) => `${px(i)},${py(value(r), max)}`).join(" ");
    chart.append(svg("polyline", { class: cls, points }));
    scored.forEach(([r, i]) => chart.append(titled(svg("circle", {
      class: `${cls}-point`, cx: px(i), cy: py(value(r), max), r: 3.5, "data-round": r.round,
    }), `round ${r.round + 1}: ${name} ${fmt(value(r))}`)));
  }
  $("#curves").replaceChildren(chart);
}

function renderMemory(plan, ledger) {
  if (!plan) return;
  const rows = [
    ["train", plan.train.memory_estimate_mb, plan.train.memory_mb],
    ["aggregate", plan.aggregate_memory_estimate_mb ?? null, plan.aggregate_memory_mb],
    // The training action evaluates, with memory of its own where its sets need more.
    ["evaluate", null, Math.max(plan.evaluate_memory_mb ?? 0, plan.train.memory_mb)],
  ].map(([kind, estimate, limit]) => {
    const lines = ledger.filter((l) => l.kind === kind);
    const peaks = lines.map((l) => l.peak_memory_mb).filter((p) => p !== null);
    return el("tr", { "data-action": kind },
      el("th", { scope: "row" }, kind),
      el("td", { class: "num" }, estimate === null ? "–" : fmt(estimate, 0)),
      el("td", { class: "num" }, String(limit)),
      el("td", { class: "num" }, peaks.length ? fmt(Math.max(...peaks), 0) : "–"),
      el("td", { class: "num" }, String(lines.length)));
  });
  $("#memory tbody").replaceChildren(...rows);
}

// ---- start --------------------------------------------------------------------------------

$("#key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = $("#api-key");
  if (!input.value.trim()) {
    say("the key is empty");
    return;
  }
  sessionStorage.setItem(KEY, input.value.trim());
  input.value = "";
  say("key kept for this browser session");
  route();
});
$("#job-filter").addEventListener("submit", (event) => event.preventDefault());
$("#filter-name").addEventListener("input", filtersChanged);
$("#filter-state").addEventListener("change", filtersChanged);
try { // as this browser session left them (a value the page no longer offers is dropped)
  const kept = JSON.parse(sessionStorage.getItem(FILTER) ?? "{}");
  $("#filter-name").value = typeof kept.name === "string" ? kept.name : "";
  $("#filter-state").value = typeof kept.state === "string" ? kept.state : "";
  if ($("#filter-state").selectedIndex < 0) $("#filter-state").value = "";
} catch {
  sessionStorage.removeItem(FILTER);
}
$("#download-model").addEventListener("click", downloadModel);
$("#forget-key").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  route();
});
window.addEventListener("hashchange", route);
route();
