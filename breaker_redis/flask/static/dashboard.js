// breaker_redis dashboard: reads {base}/stream (server-sent events) with fetch
// and an Authorization header, since EventSource cannot send one. The token
// lives in this tab's sessionStorage only: never in a URL, never in a cookie.
// Each "snapshot" event holds every breaker; this script keeps the few
// minutes of history the sparklines draw, and counts down to the next probe.
"use strict";

(function () {
  const base = document.body.dataset.base;
  const TOKEN_KEY = "breaker_redis.token";
  const HISTORY_MS = 5 * 60 * 1000; // what a sparkline shows
  const MIN_SAMPLE_MS = 900; // a rate over less than this is noise (frames also come at each change)
  const ACTIONS = [
    ["open", "Force open"],
    ["close", "Force close"],
    ["auto", "Auto"],
    ["reset", "Reset"],
  ];
  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";

  const tiles = new Map(); // name -> tile
  let token = sessionStorage.getItem(TOKEN_KEY);
  let controller = null;
  let generation = 0; // a newer connect() makes an older one give up
  let clockOffset = 0; // Redis time minus this browser's time, in ms

  function setConnection(status, text) {
    const el = $("connection");
    el.dataset.status = status;
    el.textContent = text;
  }

  function showLogin(message) {
    generation += 1;
    if (controller) controller.abort();
    token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    for (const tile of tiles.values()) tile.el.remove();
    tiles.clear();
    $("empty").hidden = true;
    $("problem").hidden = true;
    $("forget").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message || "";
    setConnection("idle", "not connected");
    $("token").focus();
  }

  async function connect() {
    const mine = ++generation;
    if (controller) controller.abort();
    controller = new AbortController();
    $("login").hidden = true;
    $("login-error").textContent = "";
    $("forget").hidden = false;
    if ($("connection").dataset.status !== "live") setConnection("connecting", "connecting…");
    let response;
    try {
      response = await fetch(base + "/stream", {
        headers: { Authorization: "Bearer " + token, Accept: "text/event-stream" },
        cache: "no-store",
        signal: controller.signal,
      });
    } catch (error) {
      if (mine === generation) reconnect(mine, 1000, "the app does not answer");
      return;
    }
    if (mine !== generation) return;
    if (response.status === 401) {
      showLogin("The token was refused (401). Check BREAKER_ADMIN_TOKEN.");
      return;
    }
    if (!response.ok || !response.body) {
      reconnect(mine, 1000, "the stream answered " + response.status);
      return;
    }
    setConnection("live", "live");
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    const stream = { retry: 1000, frames: 0 };
    let buffer = "";
    let ended = false;
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) {
          ended = true;
          break;
        }
        buffer += decoder.decode(value, { stream: true }); // the server never sends CR
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          if (mine === generation) dispatch(block, stream);
        }
      }
    } catch (error) {
      // aborted (a newer connection, or the token was forgotten) or dropped
    }
    // The server ends each stream: a threaded one after a few seconds (retry 0:
    // reconnect at once), a single-threaded one after each frame (retry 1000: poll).
    // A stream that ended without a frame (a proxy's page?) backs off instead.
    if (mine === generation) {
      const delay = ended && stream.frames ? stream.retry : Math.max(1000, stream.retry);
      reconnect(mine, delay, ended ? "live" : "reconnecting…");
    }
  }

  function reconnect(mine, delay, why) {
    if (why !== "live") setConnection("down", why);
    setTimeout(() => {
      if (mine === generation && token) connect();
    }, delay);
  }

  function dispatch(block, stream) {
    let kind = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith("event:")) kind = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      else if (line.startsWith("retry:") && /^\d+$/.test(line.slice(6).trim())) {
        stream.retry = Number(line.slice(6).trim());
      }
    }
    if (!data.length) return;
    try {
      const payload = JSON.parse(data.join("\n"));
      if (kind === "snapshot") {
        stream.frames += 1;
        render(payload);
      } else if (kind === "problem") {
        showProblem(payload.error);
        setConnection("down", "Redis does not answer");
      }
    } catch (error) {
      showProblem("cannot show this update: " + error);
    }
  }

  function showProblem(text) {
    $("problem").textContent = text;
    $("problem").hidden = false;
  }

  function render(frame) {
    clockOffset = frame.now - Date.now();
    $("problem").hidden = true;
    setConnection("live", "live");
    const seen = new Set();
    const container = $("tiles");
    for (const snapshot of frame.breakers) {
      let tile = tiles.get(snapshot.name);
      if (!tile) {
        tile = makeTile(snapshot.name);
        tiles.set(snapshot.name, tile);
      }
      update(tile, snapshot, frame.now);
      container.appendChild(tile.el); // keeps the frame's order (by name)
      seen.add(snapshot.name);
    }
    for (const [name, tile] of tiles) {
      if (!seen.has(name)) {
        tile.el.remove();
        tiles.delete(name);
      }
    }
    $("empty").hidden = frame.breakers.length > 0;
    renderGroups(frame.groups || []);
  }

  // Breaker groups: pools of replicas of which at most `cap` members may be open at once.
  function renderGroups(groups) {
    const lines = groups.map((g) => {
      const line = element("p", "group");
      line.dataset.name = g.name;
      line.dataset.full = String(g.open.length >= g.cap);
      line.appendChild(element("strong", "", g.name));
      line.appendChild(document.createTextNode(
        `: ${g.open.length} of ${g.members.length} members open (at most ${g.cap}, ` +
        `max_open_fraction ${g.max_open_fraction}): ${g.open.join(", ") || "none"}; ` +
        `${g.held} trips held back at the cap`));
      return line;
    });
    $("groups").replaceChildren(...lines);
    $("groups").hidden = lines.length === 0;
  }

  function element(tag, className, text) {
    const el = document.createElement(tag);
    if (className) el.className = className;
    if (text !== undefined) el.textContent = text;
    return el;
  }

  function figure(list, label) {
    list.appendChild(element("dt", "", label));
    const dd = element("dd", "", "–");
    list.appendChild(dd);
    return dd;
  }

  function makeTile(name) {
    const el = element("section", "tile");
    el.dataset.name = name;
    const top = element("div", "top");
    top.appendChild(element("h2", "name", name));
    const state = element("span", "state");
    const forced = element("span", "forced");
    forced.hidden = true;
    top.append(state, forced);
    const countdown = element("p", "countdown");
    // min_reporters > 1: the reporters (hosts) isolated, and how many are failing
    const reporters = element("p", "reporters");
    reporters.hidden = true;
    const list = element("dl");
    const figures = {
      rate: figure(list, "failure rate"),
      window: figure(list, "window"),
      callsPerSecond: figure(list, "calls/s"),
      rejectedPerSecond: figure(list, "rejected/s"),
      calls: figure(list, "calls"),
      rejected: figure(list, "rejected"),
      trips: figure(list, "trips"),
      probes: figure(list, "probes"),
    };
    const spark = document.createElementNS(SVG, "svg");
    spark.setAttribute("class", "spark");
    spark.setAttribute("viewBox", "0 0 300 40");
    spark.setAttribute("preserveAspectRatio", "none");
    spark.setAttribute("role", "img");
    spark.setAttribute("aria-label", "calls/s and rejected/s over the last 5 minutes");
    const callsLine = document.createElementNS(SVG, "polyline");
    callsLine.setAttribute("class", "calls");
    const rejectedLine = document.createElementNS(SVG, "polyline");
    rejectedLine.setAttribute("class", "rejected");
    spark.append(callsLine, rejectedLine);
    const legend = element("p", "legend");
    const span = element("span", "span", "");
    const peak = element("span", "peak", "");
    legend.append(
      element("span", "calls", "— calls/s"),
      document.createTextNode("  "),
      element("span", "rejected", "— rejected/s"),
      document.createTextNode(", "),
      span,
      document.createTextNode(" (5 min at most), "),
      peak,
    );
    const transitions = element("ol", "transitions");
    const actions = element("div", "actions");
    const notice = element("p", "notice");
    for (const [action, label] of ACTIONS) {
      const button = element("button", "", label);
      button.type = "button";
      button.dataset.action = action;
      button.addEventListener("click", () => act(tile, action, button));
      actions.appendChild(button);
    }
    el.append(top, countdown, reporters, list, spark, legend, transitions, actions, notice);
    const tile = {
      name, el, state, forced, countdown, reporters, figures, callsLine, rejectedLine, transitions, notice, span, peak,
      history: [], last: null, openUntil: null, countdownText: "",
    };
    return tile;
  }

  function fixed(value, digits) {
    return Number.isFinite(value) ? value.toFixed(digits) : "–";
  }

  function clock(ms) {
    const at = new Date(Number(ms));
    return isNaN(at) ? String(ms) : at.toLocaleTimeString([], { hour12: false });
  }

  function update(tile, b, now) {
    tile.el.dataset.state = b.state;
    tile.state.textContent = b.state.replace("_", " ");
    tile.forced.hidden = !b.forced;
    tile.forced.textContent = b.forced ? "forced " + b.forced : "";
    const f = tile.figures;
    f.rate.textContent = b.window_calls ? fixed((100 * b.window_failures) / b.window_calls, 1) + "%" : "–";
    // a count window (BreakerConfig.window_calls) says its size: "3 failed / 100 of the last 100"
    const ofLast = b.config && b.config.window_calls ? " of the last " + b.config.window_calls : "";
    f.window.textContent = b.window_failures + " failed / " + b.window_calls + ofLast;
    f.calls.textContent = b.calls;
    f.rejected.textContent = b.rejected;
    f.trips.textContent = b.trips;
    f.probes.textContent = b.probes_in_flight;
    const isolated = b.isolated || [];
    tile.reporters.hidden = !isolated.length && !b.failing_reporters;
    tile.reporters.textContent = (isolated.length
      ? "isolated: " + isolated.map((r) => r + " until " + clock(b.reporters[r].isolated_until_ms)).join(", ") + "; "
      : "") + b.failing_reporters + " reporter" + (b.failing_reporters === 1 ? "" : "s") + " failing";

    const last = tile.last;
    if (!last || now - last.now >= MIN_SAMPLE_MS || now < last.now) {
      if (last && now > last.now) {
        const seconds = (now - last.now) / 1000;
        // a reset zeroes the counters: count nothing rather than a negative rate
        const calls = Math.max(0, b.calls - last.calls) / seconds;
        const rejected = Math.max(0, b.rejected - last.rejected) / seconds;
        tile.history.push({ at: now, calls, rejected });
        f.callsPerSecond.textContent = fixed(calls, 1);
        f.rejectedPerSecond.textContent = fixed(rejected, 1);
      }
      tile.last = { now, calls: b.calls, rejected: b.rejected };
    }
    while (tile.history.length && tile.history[0].at < now - HISTORY_MS) tile.history.shift();
    drawSpark(tile, now);

    tile.openUntil = b.state === "open" && !b.forced ? b.open_until_ms : null;
    if (b.forced) tile.countdownText = "held " + b.forced + " until auto or reset";
    else if (b.state === "half_open")
      tile.countdownText = "probing: " + b.probes_in_flight + " in flight, " + b.half_open_successes + " succeeded";
    // the ramp after a close (ramp_seconds, docs/recovery.md): the share admitted now
    else if (b.ramp_until_ms)
      tile.countdownText = "ramping: " + fixed(100 * b.ramp_share, 0) + "% of calls admitted, all at " + clock(b.ramp_until_ms);
    else tile.countdownText = "";
    tick(tile);

    tile.transitions.replaceChildren(
      ...b.transitions
        .slice()
        .reverse()
        .map((t) => {
          const text = clock(t.at) + "  " + t.from + " → " + t.to + "  (" + t.cause + ")";
          return element("li", "", text);
        }),
    );
  }

  function drawSpark(tile, now) {
    // x spans the history held (5 minutes at most), so a page opened a moment
    // ago already draws a line across the whole box
    const points = tile.history;
    const first = points.length ? points[0].at : now;
    const span = Math.max(1000, now - first);
    const top = Math.max(1, ...points.map((p) => Math.max(p.calls, p.rejected)));
    const x = (at) => (300 * (at - first)) / span;
    const y = (value) => 38 - (36 * value) / top;
    const line = (key) => points.map((p) => x(p.at).toFixed(1) + "," + y(p[key]).toFixed(1)).join(" ");
    tile.callsLine.setAttribute("points", line("calls"));
    tile.rejectedLine.setAttribute("points", line("rejected"));
    const seconds = Math.round(span / 1000);
    tile.span.textContent = seconds >= 120 ? "last " + Math.round(seconds / 60) + " min" : "last " + seconds + " s";
    tile.peak.textContent = "peak " + fixed(top, 1) + "/s";
  }

  function tick(tile) {
    if (tile.openUntil) {
      const left = Math.max(0, tile.openUntil - (Date.now() + clockOffset)) / 1000;
      tile.countdown.textContent = "open: next probe in " + left.toFixed(1) + " s";
    } else {
      tile.countdown.textContent = tile.countdownText;
    }
  }

  async function act(tile, action, button) {
    button.disabled = true;
    tile.notice.textContent = action + "…";
    try {
      // the name in the body: a URL path would fold "..", "." or a leading "/" away
      const response = await fetch(base + "/actions", {
        method: "POST",
        headers: { Authorization: "Bearer " + token, "Content-Type": "application/json" },
        body: JSON.stringify({ breaker: tile.name, action }),
        cache: "no-store",
      });
      if (response.status === 401) {
        showLogin("The token was refused (401).");
        return;
      }
      tile.notice.textContent = response.ok ? action + ": done" : action + ": failed (" + response.status + ")";
    } catch (error) {
      tile.notice.textContent = action + ": the app does not answer";
    } finally {
      button.disabled = false;
    }
  }

  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    const given = $("token").value.trim();
    $("token").value = "";
    if (!given) return;
    token = given;
    sessionStorage.setItem(TOKEN_KEY, token);
    connect();
  });
  $("forget").addEventListener("click", () => showLogin(""));
  setInterval(() => {
    for (const tile of tiles.values()) tick(tile);
  }, 200);

  if (token) connect();
  else showLogin("");
})();
