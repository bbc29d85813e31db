// The saga page, live. The server renders everything first; this script keeps it current.
//
// The journal WebSocket (/ws/sagas/<id>/journal/?after=N) is the doorbell: each event it carries
// says which parts of the page to re-fetch. Timeline rows come from the journal endpoint by cursor
// (?after=<last rendered seq>), so a dropped socket, a gap or a replay can neither lose nor repeat
// a row: on reconnect the socket resumes after the last seq seen, and rows are keyed by seq.
(function () {
  "use strict";

  const root = document.getElementById("saga");
  if (!root || root.dataset.live !== "1") return;

  const sagaId = root.dataset.saga;
  const journalUrl = root.dataset.journalUrl;
  const partUrl = (name) => root.dataset.partUrl.replace("PART", name);
  const timeline = document.getElementById("timeline");
  const status = document.getElementById("live-status");

  const state = {
    rendered: Number(timeline.dataset.lastSeq || 0), // the highest seq in the timeline
    seen: Number(timeline.dataset.lastSeq || 0), // the highest seq the socket delivered
    socket: null,
    connects: 0,
    failures: 0,
    held: false,
    timer: null,
  };
  const dirty = new Set();
  let fetching = false;

  // Which live parts an event can change: the page's own, and the panels that name the event
  // types they show (data-events, comma-separated prefixes).
  const panels = [...document.querySelectorAll("[data-part][data-events]")].map((el) => ({
    name: el.dataset.part,
    prefixes: el.dataset.events.split(",").filter(Boolean),
  }));
  function partsFor(type) {
    const extra = panels.filter((p) => p.prefixes.some((prefix) => type.startsWith(prefix))).map((p) => p.name);
    return [...baseParts(type), ...extra];
  }

  function baseParts(type) {
    if (type.startsWith("human_request.")) return ["inbox", "stats"];
    if (type.startsWith("request.")) return ["requests", "team", "roster", "teams", "stats"];
    if (type.startsWith("worker_") || type.startsWith("run.") || type === "llm_call" || type === "model_fallback") {
      return ["workers", "team", "roster", "teams", "stats"];
    }
    if (type.startsWith("steering.")) return ["stats"];
    return ["team", "roster", "teams", "stats"];
  }

  function setStatus(name, text) {
    status.dataset.state = name;
    status.textContent = text;
  }

  function connect() {
    if (state.held) return;
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const after = Math.max(state.rendered, state.seen);
    const socket = new WebSocket(`${scheme}://${location.host}/ws/sagas/${sagaId}/journal/?after=${after}`);
    state.socket = socket;
    setStatus("connecting", state.connects ? "reconnecting…" : "connecting…");
    socket.addEventListener("open", () => {
      state.connects += 1;
      state.failures = 0;
      setStatus("live", "live");
      if (state.seen > state.rendered || dirty.size) refresh([]); // owed from before the drop
    });
    socket.addEventListener("message", (message) => {
      const body = JSON.parse(message.data);
      if (body.type !== "event") return;
      state.seen = Math.max(state.seen, body.event.seq);
      refresh(partsFor(body.event.type));
    });
    socket.addEventListener("close", () => {
      if (state.socket !== socket) return;
      state.socket = null;
      if (state.held) {
        setStatus("offline", "offline");
        return;
      }
      state.failures += 1;
      const delay = Math.min(5000, 200 * 2 ** Math.min(state.failures, 5));
      setStatus("connecting", "reconnecting…");
      setTimeout(connect, delay);
    });
  }

  // Coalesce bursts: one journal fetch and one fetch per dirty part, shortly after the last event.
  function refresh(parts) {
    parts.forEach((p) => dirty.add(p));
    clearTimeout(state.timer);
    state.timer = setTimeout(flush, 60);
  }

  async function flush() {
    if (fetching) {
      state.timer = setTimeout(flush, 60);
      return;
    }
    fetching = true;
    const parts = [...dirty];
    dirty.clear();
    try {
      await fetchNewRows();
      await Promise.all(parts.map(fetchPart));
    } catch (error) {
      // The server is out of reach (restarting, say): keep what is owed and try again.
      parts.forEach((p) => dirty.add(p));
      state.timer = setTimeout(flush, 1000);
    } finally {
      fetching = false;
    }
  }

  async function fetchNewRows() {
    for (;;) {
      const response = await get(`${journalUrl}?after=${state.rendered}`);
      if (!response) return;
      const rows = parseRows(await response.text());
      for (const row of rows) insertRow(row);
      if (response.headers.get("X-More") !== "1" || rows.length === 0) return;
    }
  }

  // A server error (the app restarting behind a proxy, say) throws, so that flush() keeps what is
  // owed and tries again; a refusal (signed out, access withdrawn) gives null: nothing to show.
  async function get(url) {
    const response = await fetch(url, { credentials: "same-origin" });
    if (response.status >= 500) throw new Error(`${url}: ${response.status}`);
    return response.ok ? response : null;
  }

  function parseRows(html) {
    const holder = document.createElement("template");
    holder.innerHTML = html;
    return [...holder.content.querySelectorAll("li[data-seq]")];
  }

  function insertRow(row) {
    const seq = Number(row.dataset.seq);
    if (seq <= state.rendered || timeline.querySelector(`li[data-seq="${seq}"]`)) return;
    timeline.querySelector("[data-empty]")?.remove();
    row.classList.add("is-new");
    timeline.prepend(row); // newest first
    state.rendered = seq;
    state.seen = Math.max(state.seen, seq);
  }

  async function fetchPart(name) {
    const holder = document.getElementById(`part-${name}`);
    if (!holder) return;
    const response = await get(partUrl(name));
    if (!response) return;
    const html = await response.text();
    if (name === "inbox") mergeInbox(holder, html);
    else holder.innerHTML = html;
  }

  // Re-rendering the inbox must not wipe a form someone is filling in: forms still pending keep
  // their element (and what was typed); only added and answered ones change.
  function mergeInbox(holder, html) {
    const next = document.createElement("div");
    next.innerHTML = html;
    const signature = (el) =>
      [...el.querySelectorAll("[data-form-id]")].map((a) => a.dataset.formId).join(",") +
      "|" +
      (el.querySelector("[data-answered-count]")?.dataset.answeredCount || "0");
    if (signature(holder) === signature(next)) return;
    for (const fresh of next.querySelectorAll("[data-form-id]")) {
      const kept = holder.querySelector(`[data-form-id="${CSS.escape(fresh.dataset.formId)}"]`);
      if (kept) fresh.replaceWith(kept);
    }
    holder.replaceChildren(...next.childNodes);
  }

  // "Load older": page back through the journal without leaving the page.
  document.addEventListener("click", async (click) => {
    const link = click.target.closest("#load-older");
    if (!link) return;
    click.preventDefault();
    const response = await fetch(`${journalUrl}?before=${link.dataset.before}`, { credentials: "same-origin" });
    if (!response.ok) return;
    const rows = parseRows(await response.text());
    for (const row of rows) {
      if (!timeline.querySelector(`li[data-seq="${row.dataset.seq}"]`)) timeline.append(row);
    }
    const oldest = Math.min(...[...timeline.querySelectorAll("li[data-seq]")].map((li) => Number(li.dataset.seq)));
    link.dataset.before = String(oldest);
    link.href = `?before=${oldest}#journal`;
    if (response.headers.get("X-More") !== "1") link.parentElement.remove();
  });

  // For operators and tests: drop the socket as a network failure would; `hold` keeps it down
  // until release() so that events can happen meanwhile.
  window.agoraLive = {
    state,
    drop({ hold = false } = {}) {
      state.held = hold;
      state.socket?.close();
    },
    release() {
      state.held = false;
      if (!state.socket) connect();
    },
    seqs: () => [...timeline.querySelectorAll("li[data-seq]")].map((li) => Number(li.dataset.seq)),
  };

  connect();
})();
