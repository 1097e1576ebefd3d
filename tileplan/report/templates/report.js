// tileplan report: the interactive views, plain JS drawing SVG from the page's JSON data
// (<script type="application/json" id="page-data">, made by report/html.py: page_data).
// Views: the tile map (hover a tile for its numbers, click to chart its liveness), liveness
// per step of the worst and the chosen tile, the BSP execution trace (tiles x steps, zoom with
// the wheel or the buttons), and the compare selector. No network, no library. Names from the
// model reach the page only as text (textContent, text nodes, attribute values), never as HTML.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("page-data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const CLASS_COLOURS = {parameters: "#8172b2", activations: "#4c72b0", partials: "#dd8452", transient: "#55a868"};
  const tip = document.getElementById("tooltip");
  const fmt = (x) => Math.round(x).toLocaleString("en-US");
  let chosenTile = D.tiles - 1;      // until a tile is clicked: the last tile (the worst is charted beside it)

  function el(name, attrs, parent) {
    const e = document.createElementNS(NS, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  // A tooltip: ``title`` in bold, ``rest`` after it on the first line, then each of ``lines`` on
  // its own line. Built as DOM text nodes, never parsed as HTML: step and op names come from the
  // model and are shown as the text they are.
  function showTip(evt, title, rest, lines) {
    const b = document.createElement("b");
    b.textContent = title;
    const parts = [b, document.createTextNode(rest)];
    for (const line of lines) parts.push(document.createElement("br"), document.createTextNode(line));
    tip.replaceChildren(...parts);
    tip.style.display = "block";
    tip.style.left = (evt.pageX + 14) + "px";
    tip.style.top = (evt.pageY + 12) + "px";
  }
  function hideTip() { tip.style.display = "none"; }
  function colour(f) {            // 0..1 -> a light-to-dark blue-green ramp (viridis-like ends)
    const stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
    const x = Math.max(0, Math.min(1, f)) * (stops.length - 1);
    const i = Math.min(stops.length - 2, Math.floor(x)), t = x - i;
    const c = stops[i].map((v, k) => Math.round(v + (stops[i + 1][k] - v) * t));
    return "rgb(" + c.join(",") + ")";
  }
  function liveTotal(step, tile) {
    let s = 0;
    for (let c = 0; c < D.classes.length; c++) s += D.live[c][step][tile];
    return s;
  }

  // ---- tile map ----------------------------------------------------------------------------
  const metricSel = document.getElementById("tile-metric");
  const stepSel = document.getElementById("tile-step");
  function metricValues() {
    const m = metricSel.value, st = stepSel.value === "" ? -1 : Number(stepSel.value);
    const vals = new Array(D.tiles).fill(0);
    for (let t = 0; t < D.tiles; t++) {
      if (m === "memory") vals[t] = st < 0 ? D.memory[t] : liveTotal(st, t);
      else if (m === "cycles" && D.trace) {
        if (st >= 0) vals[t] = D.trace[st][t];
        else for (let s = 0; s < D.steps.length; s++) vals[t] += D.trace[s][t];
      } else if (m === "sent" || m === "received") {
        const per = m === "sent" ? D.sent : D.received;
        if (st >= 0) vals[t] = per[String(st)] ? per[String(st)][t] : 0;
        else for (const k in per) vals[t] += per[k][t];
      }
    }
    return vals;
  }
  const UNITS = {memory: "B live", cycles: "cycles", sent: "B sent", received: "B received"};
  function drawTileMap() {
    const svg = document.getElementById("tile-map");
    svg.replaceChildren();
    const rows = D.grid[0], cols = D.grid[1], cell = Math.max(6, Math.min(18, Math.floor(900 / cols)));
    svg.setAttribute("viewBox", "0 0 " + cols * cell + " " + rows * cell);
    svg.setAttribute("width", cols * cell);
    svg.setAttribute("height", rows * cell);
    const vals = metricValues();
    let lo = Infinity, hi = -Infinity;
    for (const v of vals) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    const m = metricSel.value, st = stepSel.value;
    const stepName = st === "" ? "all steps" : D.steps[Number(st)].name;
    for (let t = 0; t < D.tiles; t++) {
      const r = el("rect", {x: (t % cols) * cell, y: Math.floor(t / cols) * cell, width: cell - 1, height: cell - 1,
                            fill: colour(hi > lo ? (vals[t] - lo) / (hi - lo) : 0.5), "data-tile": t,
                            class: "tile" + (t === chosenTile ? " chosen" : "")}, svg);
      r.addEventListener("mouseenter", (e) => {
        const lines = [fmt(vals[t]) + " " + UNITS[m] + " (" + stepName + ")", D.memory_label + ": " + fmt(D.memory[t]) + " B"];
        if (D.trace && st !== "") lines.push("step cycles: " + fmt(D.trace[Number(st)][t]));
        showTip(e, "tile " + t, "", lines);
      });
      r.addEventListener("mousemove", (e) => { tip.style.left = (e.pageX + 14) + "px"; tip.style.top = (e.pageY + 12) + "px"; });
      r.addEventListener("mouseleave", hideTip);
      r.addEventListener("click", () => { chosenTile = t; drawTileMap(); drawLiveness(); });
    }
    document.getElementById("tile-scale").textContent =
      "colour: " + UNITS[m] + ", " + stepName + ": lowest " + fmt(lo) + ", highest " + fmt(hi) +
      "; chosen tile " + chosenTile + " (click a tile to choose)";
  }

  // ---- liveness ----------------------------------------------------------------------------
  // Layout: the bars in [L, W - R]; the class key above them and the always-live label in the
  // right margin (never over a bar); step numbers below, one every ``every`` steps so that no two
  // labels come closer than TICK_GAP pixels.
  const TICK_GAP = 34;
  function liveChart(svgId, tile, title) {
    const svg = document.getElementById(svgId);
    svg.replaceChildren();
    const W = 900, H = 250, L = 70, R = 130, B = 40, T = 40, n = D.steps.length;
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    let top = 1;
    for (let s = 0; s < n; s++) top = Math.max(top, liveTotal(s, tile));
    const bw = (W - L - R) / Math.max(n, 1), y = (v) => H - B - (H - B - T) * v / top;
    el("text", {x: L, y: 14, class: "chart-title"}, svg).textContent = title + " (most bytes live " + fmt(top) + " B)";
    let kx = L;
    D.classes.forEach((c) => {
      el("rect", {x: kx, y: 22, width: 10, height: 10, fill: CLASS_COLOURS[c]}, svg);
      const t = el("text", {x: kx + 14, y: 31, class: "axis legend-key"}, svg);
      t.textContent = c;
      kx += 24 + 7 * c.length;
    });
    for (const f of [0, 0.5, 1]) {
      el("line", {x1: L, x2: W - R, y1: y(top * f), y2: y(top * f), class: "gridline"}, svg);
      el("text", {x: L - 6, y: y(top * f) + 4, class: "axis", "text-anchor": "end"}, svg).textContent = fmt(top * f);
    }
    const every = Math.max(1, Math.ceil(TICK_GAP / bw));
    const bars = el("g", {class: "bars"}, svg);
    for (let s = 0; s < n; s++) {
      let base = 0;
      const parts = [];
      D.classes.forEach((c, k) => {
        const v = D.live[k][s][tile];
        parts.push(c + ": " + fmt(v) + " B");
        if (v > 0) el("rect", {x: L + s * bw + 1, y: y(base + v), width: Math.max(1, bw - 2), height: y(base) - y(base + v),
                               fill: CLASS_COLOURS[c], class: "bar"}, bars);
        base += v;
      });
      const hit = el("rect", {x: L + s * bw, y: T, width: bw, height: H - B - T, class: "hit", "data-step": s}, svg);
      hit.addEventListener("mouseenter", (e) => showTip(e, D.steps[s].name, " (step " + s + ", tile " + tile + ")",
                                                        parts.concat(["total " + fmt(base) + " B"])));
      hit.addEventListener("mouseleave", hideTip);
      if (s % every === 0)
        el("text", {x: L + s * bw + bw / 2, y: H - B + 14, class: "axis tick", "text-anchor": "middle"}, svg).textContent = s;
    }
    const always = D.always[tile];
    if (always > 0) {
      el("line", {x1: L, x2: W - R, y1: y(always), y2: y(always), class: "always"}, svg);
      const t = el("text", {x: W - R + 6, y: y(always) + 4, class: "axis always-label"}, svg);
      t.textContent = "always live " + fmt(always) + " B";
    }
    el("text", {x: L + (W - L - R) / 2, y: H - 6, class: "axis", "text-anchor": "middle"}, svg).textContent =
      "program step" + (every > 1 ? " (every " + every + "th numbered; hover a bar for its name)" : " (hover a bar for its name)");
  }
  function drawLiveness() {
    liveChart("live-worst", D.worst, "worst tile " + D.worst);
    liveChart("live-chosen", chosenTile, "chosen tile " + chosenTile);
  }

  // ---- BSP execution trace -----------------------------------------------------------------
  // Drawn in pixels (the view's cycles mapped onto [L, W - 10]): a band of step names on top (a
  // step's name where its column is wide enough, every step named in its tooltip), the tiles' rows,
  // and an axis of cycles below with ticks at round numbers no closer than 90 pixels.
  let view = null;
  function niceStep(span, count) {
    const raw = span / Math.max(count, 1), p = Math.pow(10, Math.floor(Math.log10(Math.max(raw, 1))));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }
  function drawTrace() {
    const svg = document.getElementById("trace");
    if (!svg || !D.trace) return;
    svg.replaceChildren();
    const n = D.steps.length, bins = Math.min(D.tiles, 128), per = Math.ceil(D.tiles / bins);
    const rowsN = Math.ceil(D.tiles / per);
    const len = [], start = [];
    let t = 0;
    for (let s = 0; s < n; s++) {
      let mx = 0;
      for (const c of D.trace[s]) mx = Math.max(mx, c);
      start.push(t); len.push(mx + D.sync[s]); t += mx + D.sync[s];
    }
    const total = Math.max(t, 1), W = 1000, L = 64, TOP = 34, AX = 40;
    const rowH = Math.max(2, Math.min(8, Math.floor(400 / rowsN))), H = rowsN * rowH;
    if (!view) view = [0, total];
    const span = view[1] - view[0], x = (c) => L + (c - view[0]) * (W - 10 - L) / span;
    svg.setAttribute("viewBox", "0 0 " + W + " " + (TOP + H + AX));
    const clip = el("clipPath", {id: "trace-clip"}, el("defs", {}, svg));
    el("rect", {x: L, y: 0, width: W - 10 - L, height: TOP + H}, clip);
    const plot = el("g", {"clip-path": "url(#trace-clip)"}, svg);
    for (let s = 0; s < n; s++) {
      const kind = D.steps[s].kind, sync = D.sync[s];
      if (x(start[s] + len[s]) < L || x(start[s]) > W - 10) continue;
      const x0 = x(start[s]), x1 = x(start[s] + len[s]);
      const head = el("rect", {x: x0, y: 2, width: Math.max(0.5, x1 - x0), height: TOP - 6, class: "step-head",
                               "data-step": s}, plot);
      head.addEventListener("mouseenter", (e) => showTip(e, D.steps[s].name, " (step " + s + ", " + kind + ")",
        [fmt(len[s]) + " cycles incl. sync " + fmt(sync) + ", starts at " + fmt(start[s])]));
      head.addEventListener("mouseleave", hideTip);
      const vx0 = Math.max(x0, L), avail = Math.min(x1, W - 10) - vx0 - 6;    // the visible part of the column
      if (avail >= 24) {                          // the name, cut (measured) to fit its column
        const name = D.steps[s].name;
        const label = el("text", {x: vx0 + 3, y: TOP - 12, class: "axis step-name", "data-step": s}, plot);
        label.textContent = name;
        for (let k = name.length - 1; k > 0 && label.getComputedTextLength() > avail; k--)
          label.textContent = name.slice(0, k) + "\u2026";
        if (label.getComputedTextLength() > avail) label.remove();
      }
      if (sync > 0) el("rect", {x: x0, y: TOP, width: Math.max(0.3, x(start[s] + sync) - x0), height: H, fill: "#d0d0d0"}, plot);
      for (let b = 0; b < rowsN; b++) {
        let mx = 0, sum = 0, cnt = 0;
        for (let k = b * per; k < Math.min(D.tiles, (b + 1) * per); k++) { const c = D.trace[s][k]; mx = Math.max(mx, c); sum += c; cnt++; }
        if (mx === 0) continue;
        const r = el("rect", {x: x(start[s] + sync), y: TOP + b * rowH, width: Math.max(0.3, x(start[s] + sync + mx) - x(start[s] + sync)),
                              height: rowH - (rowH > 3 ? 1 : 0),
                              fill: kind === "compute" ? "#4c72b0" : "#dd8452", "fill-opacity": 0.35 + 0.65 * (sum / cnt) / mx,
                              class: "cell", "data-step": s, "data-bin": b}, plot);
        const lo = b * per, hi = Math.min(D.tiles, (b + 1) * per) - 1;
        r.addEventListener("mouseenter", (e) => showTip(e, D.steps[s].name, " (" + kind + ")", [
          "tiles " + lo + (hi > lo ? "-" + hi : "") + ": slowest " + fmt(mx) + ", mean " + fmt(sum / cnt) + " cycles",
          "step: " + fmt(len[s]) + " cycles incl. sync " + fmt(sync) + ", starts at " + fmt(start[s])]));
        r.addEventListener("mouseleave", hideTip);
      }
    }
    el("text", {x: L - 6, y: TOP + 10, class: "axis", "text-anchor": "end"}, svg).textContent = "tile 0";
    el("text", {x: L - 6, y: TOP + H, class: "axis", "text-anchor": "end"}, svg).textContent = "tile " + (D.tiles - 1);
    el("line", {x1: L, x2: W - 10, y1: TOP + H + 1, y2: TOP + H + 1, class: "gridline"}, svg);
    const tick = niceStep(span, Math.floor((W - 10 - L) / 90));
    for (let c = Math.ceil(view[0] / tick) * tick; c <= view[1] + 1e-9; c += tick) {
      el("line", {x1: x(c), x2: x(c), y1: TOP + H + 1, y2: TOP + H + 5, class: "gridline"}, svg);
      el("text", {x: x(c), y: TOP + H + 17, class: "axis cycle-tick", "text-anchor": "middle"}, svg).textContent = fmt(c);
    }
    el("text", {x: L + (W - 10 - L) / 2, y: TOP + H + 34, class: "axis", "text-anchor": "middle"}, svg).textContent =
      "cycles from the start of the program";
    document.getElementById("trace-range").textContent =
      "cycles " + fmt(view[0]) + " to " + fmt(view[1]) + " of " + fmt(total) + "; " + rowsN + " rows of " + per +
      " tile" + (per > 1 ? "s" : "") + " (bar: the slowest tile of the row, opacity: mean / slowest)";
    svg.dataset.total = total;
  }
  function zoom(factor, centre) {
    const svg = document.getElementById("trace");
    const total = Number(svg.dataset.total);
    const w = Math.min(total, Math.max(50, (view[1] - view[0]) * factor));
    const c = centre === undefined ? (view[0] + view[1]) / 2 : centre;
    let a = Math.max(0, c - w / 2);
    a = Math.min(a, total - w);
    view = [a, a + w];
    drawTrace();
  }

  // ---- compare -----------------------------------------------------------------------------
  function showCompare() {
    const sel = document.getElementById("compare-select");
    document.querySelectorAll(".compare-block").forEach((b) => {
      b.style.display = b.dataset.index === sel.value ? "" : "none";
    });
  }

  // ---- wiring ------------------------------------------------------------------------------
  metricSel.addEventListener("change", drawTileMap);
  stepSel.addEventListener("change", drawTileMap);
  drawTileMap();
  drawLiveness();
  const trace = document.getElementById("trace");
  if (trace && D.trace) {
    drawTrace();
    trace.addEventListener("wheel", (e) => {
      e.preventDefault();
      const box = trace.getBoundingClientRect();
      const px = (e.clientX - box.left) * 1000 / box.width;        // the viewBox is 1000 wide, plot from 64 to 990
      zoom(e.deltaY < 0 ? 0.8 : 1.25, view[0] + (view[1] - view[0]) * Math.min(1, Math.max(0, (px - 64) / 926)));
    }, {passive: false});
    document.getElementById("zoom-in").addEventListener("click", () => zoom(0.5));
    document.getElementById("zoom-out").addEventListener("click", () => zoom(2));
    document.getElementById("zoom-reset").addEventListener("click", () => { view = null; drawTrace(); });
  }
  const csel = document.getElementById("compare-select");
  if (csel) { csel.addEventListener("change", showCompare); showCompare(); }
  document.body.dataset.ready = "1";
})();
