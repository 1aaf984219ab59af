// mrunner's page: plain JavaScript against the daemon's own API, same origin, nothing fetched from elsewhere.
"use strict";

const $ = (id) => document.getElementById(id);
const POLL_MS = 1000;
const MAX_LOG_LINES = 2000;
const MAX_REQUEST_ROWS = 200;

// API keys: asked for on a 401, kept in this tab's sessionStorage, sent as a Bearer token.
// A key the daemon refuses is said so, and asked for again.
let apiKey = sessionStorage.getItem("mrunner-key") || "";
let keyWaiters = [];

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  apiKey = $("key-input").value.trim();
  sessionStorage.setItem("mrunner-key", apiKey);
  $("key-form").hidden = true;
  say("");
  const waiters = keyWaiters;
  keyWaiters = [];
  waiters.forEach((resume) => resume());
});

function askForKey(refused) {
  if (!keyWaiters.length) {
    $("key-refused").hidden = !refused;
    $("key-input").value = "";
  }
  $("key-form").hidden = false;
  $("key-input").focus();
  say(refused ? "the API key was refused" : "waiting for an API key");
  return new Promise((resume) => keyWaiters.push(resume));
}

async function api(path, init = {}) {
  for (;;) {
    const sent = apiKey;
    const headers = new Headers(init.headers || {});
    if (sent) headers.set("Authorization", "Bearer " + sent);
    const response = await fetch(path, { ...init, headers });
    if (response.status !== 401) return response;
    if (sent === apiKey) await askForKey(Boolean(sent));
  }
}

// The daemon's error as an Error, with its code (context_length_exceeded, ...) when it has one.
async function failure(response) {
  let body;
  try {
    body = await response.json();
  } catch (e) {
    return new Error("HTTP " + response.status);
  }
  return body && body.error ? apiError(body.error) : new Error("HTTP " + response.status);
}

function apiError(error) {
  const e = new Error(error.message || String(error));
  e.code = error.code;
  return e;
}

async function getJSON(path, init) {
  const response = await api(path, init);
  if (!response.ok) throw await failure(response);
  return response.json();
}

function say(text) {
  $("status").textContent = text || "";
}

function element(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = text;
  if (className) node.className = className;
  return node;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    const td = document.createElement("td");
    if (cell instanceof Node) td.append(cell);
    else td.textContent = cell === null || cell === undefined ? "" : String(cell);
    tr.append(td);
  }
  return tr;
}

function size(bytes) {
  if (bytes === null || bytes === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return (unit ? value.toFixed(1) : value) + " " + units[unit];
}

// "1 hit", "2 hits", "0 misses": a count with its noun, singular for one.
function plural(count, noun, nouns = noun + "s") {
  return count + " " + (count === 1 ? noun : nouns);
}

function seconds(value) {
  return value === null || value === undefined ? "-" : value.toFixed(3) + " s";
}

// Lines of a streamed body as they arrive (NDJSON, server-sent events, logs).
async function readLines(response, onLine) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let newline;
    while ((newline = buffer.indexOf("\n")) >= 0) {
      onLine(buffer.slice(0, newline));
      buffer = buffer.slice(newline + 1);
    }
  }
  if (buffer) onLine(buffer);
}

// Runners, live: polled once a second.
function memoryBar(runner, budget) {
  const bar = element("div", null, "bar");
  const scale = budget || Math.max(runner.memory, 1);
  const used = element("span");
  used.style.width = Math.min(100, (100 * runner.memory) / scale) + "%";
  const estimate = element("i");
  estimate.style.left = Math.min(100, (100 * runner.memory_estimate) / scale) + "%";
  estimate.title = "estimate";
  bar.append(used, estimate);
  bar.title = size(runner.memory) + " of a budget of " + (budget ? size(budget) : "none");
  const cell = element("div");
  cell.append(bar, element("small", size(runner.memory_estimate) + " / " + size(runner.memory_measured)));
  return cell;
}

function countdown(runner, now) {
  if (runner.pinned) return "pinned";
  if (runner.keep_alive === null) return "never";
  if (!runner.expires_at) return runner.in_use ? "when idle" : "-";
  const left = Math.max(0, Math.round(Date.parse(runner.expires_at) / 1000 - now));
  return Math.floor(left / 60) + ":" + String(left % 60).padStart(2, "0");
}

async function unload(runner, button) {
  button.disabled = true;
  try {
    await getJSON("/engines/unload", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ backend: runner.backend_name, models: [runner.model_name] }),
    });
  } catch (e) {
    say("unload failed: " + e.message);
  }
}

function showRunners(overview) {
  // A key that is not an admin reads: what it cannot do (unload, pull, delete, logs, records) is hidden.
  document.body.classList.toggle("reader", !overview.admin);
  const rows = $("runner-rows");
  rows.replaceChildren();
  let used = 0;
  // Each model's queue goes on its first runner's row, or on a row of its own while its runner starts.
  const queues = new Map(overview.waiting.map((w) => [w.model, w]));
  const queued = (model) => {
    const w = queues.get(model);
    queues.delete(model);
    return w ? " · " + w.waiting + " waiting, the oldest " + seconds(w.oldest_wait) : "";
  };
  // The prompt cache's counts for a model, where the cache is on and has seen its turns.
  const cached = (model) => {
    const c = (overview.cache || {})[model];
    return c ? " · prompt cache: " + plural(c.hits, "hit") + " (" + c.restores + " restored), " +
      plural(c.misses, "miss", "misses") : "";
  };
  // Fewer slots than [scheduler] parallel asks: the memory budget holds no more whole contexts.
  const fewer = (runner) => runner.parallel_configured > runner.parallel ?
    " (of " + runner.parallel_configured + " asked: the memory budget holds no more)" : "";
  for (const runner of overview.runners) {
    used += runner.memory;
    const button = element("button", "Unload", "admin-only");
    button.addEventListener("click", () => unload(runner, button));
    const tr = row([
      runner.model_name,
      runner.mode,
      element("span", runner.state, "state-" + runner.state),
      runner.in_use + " / " + runner.parallel + fewer(runner) + queued(runner.model_name) +
        cached(runner.model_name),
      memoryBar(runner, overview.memory_budget),
      countdown(runner, overview.now),
      button,
    ]);
    tr.dataset.model = runner.model_name;
    tr.dataset.state = runner.state;
    tr.dataset.inUse = runner.in_use;
    rows.append(tr);
  }
  for (const w of queues.values()) {
    const tr = row([w.model, "-", element("span", "waiting", "state-waiting"), "0" + queued(w.model), "-", "-", ""]);
    tr.dataset.model = w.model;
    tr.dataset.state = "waiting";
    rows.append(tr);
  }
  $("no-runners").hidden = rows.children.length > 0;
  const budget = overview.memory_budget;
  $("total-bar").style.width = budget ? Math.min(100, (100 * used) / budget) + "%" : "0";
  $("summary").textContent =
    overview.runners.length + " loaded · " + overview.queue + " waiting · memory " + size(used) +
    " of " + (budget ? size(budget) : "no budget");
}

// Devices (GPUs, and the host's RAM as CPU): polled every few seconds, as each look may run llama-server.
const DEVICES_POLL_MS = 5000;

function showDevices(answer) {
  const rows = answer.devices.map((device) => {
    const row = element("div", null, "device");
    const bar = element("div", null, "bar");
    const used = element("span");
    used.style.width = device.budget ? Math.min(100, (100 * device.used) / device.budget) + "%" : "0";
    const taken = element("i");
    taken.style.left = Math.min(100, (100 * (device.memory_total - device.memory_free)) / device.budget) + "%";
    taken.title = "in use on the device, by anything";
    bar.append(used, taken);
    bar.title = size(device.used) + " of a budget of " + size(device.budget);
    row.append(
      element("b", device.id),
      bar,
      element("small", device.name + " · runners " + size(device.used) + " of " + size(device.budget) +
        " · free " + size(device.memory_free) + " of " + size(device.memory_total)),
    );
    return row;
  });
  $("device-bars").replaceChildren(...rows);
  $("device-bars").title = "llama-server build: " + answer.variant;
}

async function pollDevices() {
  try {
    showDevices(await getJSON("/engines/devices"));
  } catch (e) {
    // The runners' poll says when the daemon is unreachable.
  }
  setTimeout(pollDevices, DEVICES_POLL_MS);
}

async function pollRunners() {
  try {
    showRunners(await getJSON("/engines/overview"));
    if ($("status").textContent.startsWith("daemon")) say("");
  } catch (e) {
    say("daemon unreachable: " + e.message);
  }
  setTimeout(pollRunners, POLL_MS);
}

// Models: the store, pull with progress, delete with a confirmation.
let models = [];

async function loadModels() {
  try {
    models = await getJSON("/models");
  } catch (e) {
    say("models: " + e.message);
    return;
  }
  const rows = $("model-rows");
  rows.replaceChildren();
  for (const model of models) {
    const config = model.config || {};
    for (const name of model.tags.length ? model.tags : [model.id]) {
      const button = element("button", "Delete", "admin-only");
      button.addEventListener("click", () => deleteModel(model, name));
      const tr = row([name, config.size || "-", config.quantization || "-", config.parameters || "-",
        config.context_size || "-", button]);
      tr.dataset.model = name;
      rows.append(tr);
    }
  }
  $("no-models").hidden = models.length > 0;
  fillModelChoices();
}

// One name of a model: only that name goes while others remain (as `mrunner rm`), else the model.
async function deleteModel(model, name) {
  const others = model.tags.filter((tag) => tag !== name);
  const question = others.length
    ? "Remove the name " + name + "? The model stays as " + others.join(", ") + "."
    : "Delete " + name + "? Its runners are unloaded.";
  if (!confirm(question)) return;
  try {
    await getJSON("/models/" + encodeURI(name), { method: "DELETE" });
  } catch (e) {
    say("delete failed: " + e.message);
  }
  showModels();
}

$("pull-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const ref = $("pull-ref").value.trim();
  const bar = $("pull-bar");
  const status = $("pull-status");
  const layers = {};
  bar.hidden = false;
  bar.value = 0;
  status.textContent = "pulling " + ref + "…";
  try {
    const response = await api("/models/create", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ from: ref }),
    });
    if (!response.ok) throw await failure(response);
    await readLines(response, (line) => {
      if (!line.trim()) return;
      const message = JSON.parse(line);
      if (message.type === "progress") {
        layers[message.layer.id] = message.layer.current;
        const done = Object.values(layers).reduce((a, b) => a + b, 0);
        bar.value = message.total ? done / message.total : 0;
        status.textContent = size(done) + " of " + size(message.total);
      } else {
        status.textContent = message.message;
        if (message.type === "success") bar.value = 1;
      }
    });
  } catch (e) {
    status.textContent = "pull failed: " + e.message;
  }
  showModels();
});

// Found: the models other tools keep on this machine, an admin's view (it shows their folders).
// Import links a model's files into the store; the list marks the ones the store has already.
function showModels() {
  loadModels();
  loadFound();
}

async function loadFound() {
  const note = $("no-found");
  let found;
  try {
    found = await getJSON("/models?found=1");
  } catch (e) {
    // A key that is not an admin's may not look: its page hides the list, and that is no error.
    note.textContent = "Could not look in other tools' folders: " + e.message;
    note.classList.add("failed");
    note.hidden = e.code === "admin_only";
    return;
  }
  $("found-rows").replaceChildren(...found.map(foundRow));
  note.textContent = "No other tool's model found on this machine.";
  note.classList.remove("failed");
  note.hidden = found.length > 0;
}

// A found model's row: Import where it can be imported and is not in the store yet.
function foundRow(entry) {
  const stored = entry.in_store.length > 0;
  const mark = entry.problem ? "refused: " + entry.problem : stored ? "as " + entry.in_store.join(", ") : "no";
  let action = "";
  if (!entry.problem && !stored) {
    action = element("button", "Import");
    action.addEventListener("click", () => importFound(entry, action));
  }
  const tr = row([entry.name, entry.source, size(entry.size), entry.quantization || "-", entry.path, mark, action]);
  tr.children[4].className = "where";
  tr.children[4].title = entry.ref;
  if (entry.problem) tr.children[5].className = "problem";
  tr.dataset.ref = entry.ref;
  tr.dataset.inStore = stored ? entry.in_store.join(" ") : "";
  return tr;
}

function foundStatus(text, failed = false) {
  $("found-status").textContent = text;
  $("found-status").classList.toggle("failed", failed);
  $("found-status").hidden = false;
}

async function importFound(entry, button) {
  button.disabled = true;
  button.textContent = "Importing…";
  foundStatus("importing " + entry.ref + "…");
  try {
    const model = await getJSON("/models/import", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ from: entry.ref }),
    });
    const how = [model.import.message, ...model.import.notes].join("; ");
    foundStatus("imported " + entry.ref + " as " + model.tags.join(", ") + ": " + how);
  } catch (e) {
    foundStatus("import of " + entry.ref + " failed: " + e.message, true);
  }
  showModels();
}

// Chat: the conversation lives in the page; Stop aborts the request, which stops the generation.
const conversation = [];
let chatAbort = null;

function fillModelChoices() {
  const names = models.flatMap((model) => model.tags);
  for (const select of [$("chat-model"), $("log-source")]) {
    const keep = select.value;
    for (const option of [...select.options]) if (option.dataset.model) option.remove();
    for (const name of names) {
      const option = element("option", name);
      option.value = name;
      option.dataset.model = "1";
      select.append(option);
    }
    if ([...select.options].some((option) => option.value === keep)) select.value = keep;
  }
}

function showMessage(role, text) {
  const div = element("div", null, "msg " + role);
  div.append(element("b", role), element("span", text));
  $("conversation").append(div);
  return div;
}

function newConversation() {
  conversation.length = 0;
  $("conversation").replaceChildren();
}

$("chat-clear").addEventListener("click", newConversation);

// The conversation outgrew the model's context: the daemon's words say so; offer a new one.
function offerNewConversation(answer, message) {
  answer.dataset.state = "too-long";
  const note = element("div", message + " ", "note");
  const button = element("button", "Start a new conversation");
  button.id = "chat-new";
  button.type = "button";
  button.addEventListener("click", newConversation);
  note.append(button);
  answer.append(note);
  $("conversation").scrollTop = $("conversation").scrollHeight;
}

$("chat-input").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("chat-form").requestSubmit();
  }
});

$("chat-stop").addEventListener("click", () => chatAbort && chatAbort.abort());

function chatRequest(model) {
  const request = { model, messages: conversation, stream: true };
  const maxTokens = parseInt($("chat-max-tokens").value, 10);
  if (maxTokens > 0) request.max_tokens = maxTokens;
  return request;
}

$("chat-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const text = $("chat-input").value.trim();
  const model = $("chat-model").value;
  if (!text || !model || chatAbort) return;
  $("chat-input").value = "";
  conversation.push({ role: "user", content: text });
  showMessage("user", text);
  const answer = showMessage("assistant", "");
  answer.dataset.state = "streaming";
  const out = answer.querySelector("span");
  chatAbort = new AbortController();
  $("chat-send").disabled = true;
  $("chat-stop").disabled = false;
  let reply = "";
  try {
    const response = await api("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(chatRequest(model)),
      signal: chatAbort.signal,
    });
    if (!response.ok) throw await failure(response);
    await readLines(response, (line) => {
      if (!line.startsWith("data: ") || line === "data: [DONE]") return;
      const chunk = JSON.parse(line.slice(6));
      if (chunk.error) throw apiError(chunk.error);
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta && delta.content) {
        reply += delta.content;
        out.textContent = reply;
        $("conversation").scrollTop = $("conversation").scrollHeight;
      }
    });
    answer.dataset.state = "done";
  } catch (e) {
    const stopped = e.name === "AbortError";
    if (e.code === "context_length_exceeded") {
      offerNewConversation(answer, e.message);
    } else {
      answer.dataset.state = stopped ? "stopped" : "failed";
      answer.append(element("div", stopped ? "(stopped)" : "error: " + e.message, "note"));
    }
  }
  conversation.push({ role: "assistant", content: reply });
  chatAbort = null;
  $("chat-send").disabled = false;
  $("chat-stop").disabled = true;
});

// Logs and requests: followed while their view is shown.
let follow = null;

function stopFollowing() {
  if (follow) follow.abort();
  follow = null;
}

async function followLogs() {
  stopFollowing();
  const pre = $("log-lines");
  pre.textContent = "";
  const params = new URLSearchParams();
  if ($("log-source").value) params.set("source", $("log-source").value);
  if ($("log-follow").checked) params.set("follow", "true");
  const controller = (follow = new AbortController());
  const write = logWriter(pre, controller.signal);
  try {
    const response = await api("/logs?" + params, { signal: controller.signal });
    if (!response.ok) throw await failure(response);
    await readLines(response, write);
  } catch (e) {
    if (e.name !== "AbortError") write("(" + e.message + ")");
  }
}

// Lines into the Logs view once a frame, each batch one text node, the oldest batches dropped past
// MAX_LOG_LINES: a <pre> re-set once per line blocked the tab for 227 s on a 9,153-line log.
function logWriter(pre, signal) {
  let pending = [];
  const batches = []; // how many lines each of pre's text nodes holds, oldest first
  let shown = 0;
  function flush() {
    if (signal.aborted) return;
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.append(pending.join("\n") + "\n");
    batches.push(pending.length);
    shown += pending.length;
    pending = [];
    while (shown - batches[0] >= MAX_LOG_LINES) {
      pre.firstChild.remove();
      shown -= batches.shift();
    }
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }
  return (line) => {
    if (!pending.length) requestAnimationFrame(flush);
    pending.push(line);
    if (pending.length > 2 * MAX_LOG_LINES) pending = pending.slice(-MAX_LOG_LINES);
  };
}

function requestRow(record) {
  const tokens = record.tokens ? record.tokens.prompt + " + " + record.tokens.completion : "-";
  const status = record.status + (record.completed ? "" : " (cut short)");
  const text = record.answer.text || "";
  const tr = row([record.id, (record.started || "").slice(11, 19), record.model, record.route, status,
    seconds(record.timings.queued), seconds(record.timings.ttfb), seconds(record.timings.total), tokens, text]);
  tr.lastChild.className = "answer";
  tr.lastChild.title = text;
  tr.dataset.id = record.id;
  return tr;
}

async function followRequests() {
  stopFollowing();
  const rows = $("request-rows");
  rows.replaceChildren();
  $("no-requests").hidden = false;
  const controller = (follow = new AbortController());
  try {
    const response = await api("/engines/requests?follow=true&limit=" + MAX_REQUEST_ROWS, {
      signal: controller.signal,
    });
    if (!response.ok) throw await failure(response);
    await readLines(response, (line) => {
      if (!line.startsWith("data: ")) return;
      rows.prepend(requestRow(JSON.parse(line.slice(6))));
      while (rows.children.length > MAX_REQUEST_ROWS) rows.lastChild.remove();
      $("no-requests").hidden = true;
    });
  } catch (e) {
    if (e.name !== "AbortError") $("no-requests").textContent = e.message;
  }
}

// Views.
const views = { models: showModels, chat: loadModels, logs: followLogs, requests: followRequests };

function show(view) {
  stopFollowing();
  for (const button of $("tabs").children) button.classList.toggle("active", button.dataset.view === view);
  for (const section of document.querySelectorAll(".view")) section.hidden = section.id !== "view-" + view;
  views[view]();
}

for (const button of $("tabs").children) button.addEventListener("click", () => show(button.dataset.view));
$("log-source").addEventListener("change", followLogs);
$("log-follow").addEventListener("change", followLogs);

// Usage: tokens per UTC day per key, as an SVG chart the page draws itself, and the table beneath it.
const SVG = "http://www.w3.org/2000/svg";
const KEY_COLORS = ["#2563eb", "#15803d", "#c2410c", "#7c3aed", "#0891b2", "#a16207", "#db2777", "#4b5563"];

function svg(tag, attributes, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

// Stacked bars: one per day, a segment per key, scaled to the busiest day.
function usageChart(rows) {
  const days = [...new Set(rows.map((r) => r.day))].sort();
  const keys = [...new Set(rows.map((r) => r.key))].sort();
  const tokens = {};
  for (const r of rows) {
    const day = (tokens[r.day] = tokens[r.day] || {});
    day[r.key] = (day[r.key] || 0) + r.prompt_tokens + r.completion_tokens;
  }
  const busiest = Math.max(1, ...days.map((d) => Object.values(tokens[d]).reduce((a, b) => a + b, 0)));
  const [width, height, left, bottom, top] = [640, 220, 64, 22, 10];
  const chart = svg("svg", { id: "usage-svg", viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "tokens per day per key" });
  chart.append(svg("line", { x1: left, y1: height - bottom, x2: width, y2: height - bottom, class: "axis" }));
  chart.append(svg("text", { x: left - 6, y: top + 4, "text-anchor": "end", class: "axis" }, busiest.toLocaleString()));
  chart.append(svg("text", { x: left - 6, y: height - bottom, "text-anchor": "end", class: "axis" }, "0"));
  const band = (width - left) / Math.max(1, days.length);
  const barWidth = Math.min(48, band * 0.7);
  days.forEach((day, i) => {
    const x = left + i * band + (band - barWidth) / 2;
    let y = height - bottom;
    keys.forEach((key, k) => {
      const value = tokens[day][key] || 0;
      if (!value) return;
      const h = ((height - bottom - top) * value) / busiest;
      y -= h;
      const bar = svg("rect", { x, y, width: barWidth, height: h, fill: KEY_COLORS[k % KEY_COLORS.length] });
      Object.assign(bar.dataset, { key, day, tokens: value });
      bar.append(svg("title", {}, `${key}, ${day}: ${value.toLocaleString()} tokens`));
      chart.append(bar);
    });
    chart.append(svg("text", { x: x + barWidth / 2, y: height - 6, "text-anchor": "middle", class: "axis" }, day.slice(5)));
  });
  const legend = element("div", null, "legend");
  keys.forEach((key, k) => {
    const swatch = element("span", key);
    swatch.style.setProperty("--swatch", KEY_COLORS[k % KEY_COLORS.length]);
    legend.append(swatch);
  });
  $("usage-chart").replaceChildren(chart, legend);
}

async function loadUsage() {
  try {
    const rows = (await getJSON("/engines/usage?limit=1000")).data;
    $("no-usage").textContent = "No usage recorded yet.";
    $("no-usage").hidden = rows.length > 0;
    usageChart(rows);
    $("usage-rows").replaceChildren(
      ...rows.map((r) =>
        row([r.day, r.key, r.model, r.requests, r.prompt_tokens, r.completion_tokens, r.errors, seconds(r.seconds)]),
      ),
    );
  } catch (e) {
    if (e.code !== "usage_off") return say("usage: " + e.message);
    // Not an error: this daemon keeps usage only for named keys, and says how to add one.
    $("no-usage").textContent = e.message;
    $("no-usage").hidden = false;
  }
}
views.usage = loadUsage;

show("models");
pollRunners();
pollDevices();
