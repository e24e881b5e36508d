// Shared by the dashboard's pages: elements, formats, a live event stream, and uPlot line charts.
"use strict";

const hora = (() => {
  const el = (tag, attrs = {}, ...children) => {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else node.setAttribute(k, v);
    }
    for (const child of children) node.append(child);
    return node;
  };

  const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "-");

  const duration = (job) => {
    if (!job.started) return "-";
    const seconds = ((job.ended || Date.now() / 1000) - job.started);
    if (seconds < 120) return seconds.toFixed(1) + " s";
    const m = Math.floor(seconds / 60), h = Math.floor(m / 60);
    return h ? `${h} h ${m % 60} min` : `${m} min ${Math.floor(seconds % 60)} s`;
  };

  const bytes = (n) => {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return (i ? n.toFixed(1) : String(n)) + " " + units[i];
  };

  // An axis value short enough for its axis: 1.5G, 250M, 12k, 0.25.
  const compact = (v) => {
    if (v === null) return "";
    const a = Math.abs(v);
    for (const [scale, unit] of [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]]) {
      if (a >= scale) return +(v / scale).toFixed(2) + unit;
    }
    return String(+v.toFixed(4));
  };

  const WHOLE = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000];

  const status = (job) => el("span", { class: "status " + job.status, text: job.status });

  // A message across the top of the page (the server's reason a page cannot be shown); null clears it.
  const problem = (text) => {
    let box = document.getElementById("problem");
    if (!box) {
      box = el("pre", { id: "problem", class: "failure" });
      document.querySelector("main").prepend(box);
    }
    box.textContent = text || "";
    box.classList.toggle("hidden", !text);
  };

  // An EventSource with a marker showing whether it is connected; handlers: {event name: fn(parsed data)}.
  // A "problem" event (the store cannot be read) is shown; when the stream fails, `probe` (a JSON URL) is asked
  // why, and a refusal (no such job, a bad filter) ends the stream with the server's reason.
  const stream = (url, handlers, marker, probe) => {
    const source = new EventSource(url);
    for (const [name, fn] of Object.entries(handlers)) {
      source.addEventListener(name, (e) => { problem(null); fn(JSON.parse(e.data)); });
    }
    source.addEventListener("problem", (e) => problem(JSON.parse(e.data).error));
    source.onopen = () => { if (marker) { marker.classList.add("on"); marker.textContent = "live"; } };
    source.onerror = async () => {
      if (marker) { marker.classList.remove("on"); marker.textContent = "reconnecting"; }
      if (!probe) return;
      try {
        const response = await fetch(probe);
        if (response.status >= 400 && response.status < 500) {
          source.close();
          if (marker) marker.textContent = "stopped";
          problem((await response.json()).error || response.statusText);
        }
      } catch (err) { /* the server is away: EventSource keeps trying */ }
    };
    return source;
  };

  // A titled chart in `parent` whose series are {label: [[x, y], ...]}; update() redraws with new series.
  // `integerX`: x values are counts (trials, epochs), so the x axis ticks only whole numbers.
  class Chart {
    constructor(parent, title, xLabel, integerX = false) {
      this.box = el("div", { class: "chart", "data-metric": title }, el("h3", { text: title }));
      parent.append(this.box);
      this.xLabel = xLabel;
      this.integerX = integerX;
      this.plot = null;
      this.labels = "";
    }

    update(series) {
      const labels = Object.keys(series).sort();
      const xs = [...new Set(labels.flatMap((l) => series[l].map((p) => p[0])))].sort((a, b) => a - b);
      const index = new Map(xs.map((x, i) => [x, i]));
      const data = [xs, ...labels.map((l) => {
        const ys = new Array(xs.length).fill(null);
        for (const [x, y] of series[l]) ys[index.get(x)] = y;
        return ys;
      })];
      this.box.dataset.points = String(labels.reduce((n, l) => n + series[l].length, 0));
      this.box.dataset.series = String(labels.length);
      if (this.plot && this.labels === labels.join("\n")) { this.plot.setData(data); return; }
      if (this.plot) this.plot.destroy();
      this.labels = labels.join("\n");
      const colors = ["#2f6fd0", "#c0392b", "#1f8a4c", "#c77d00", "#7b3fb5", "#00838f", "#6d4c41", "#ad1457"];
      const time = this.xLabel === "time";
      this.plot = new uPlot({
        width: Math.max(420, this.box.clientWidth - 4), height: 240,
        scales: { x: { time } },
        axes: [{ label: time ? "" : this.xLabel, ...(this.integerX ? { incrs: WHOLE } : {}) },
          { values: (u, splits) => splits.map(compact), size: 60 }],
        series: [{ label: this.xLabel }, ...labels.map((l, i) => ({
          label: l, stroke: colors[i % colors.length], width: 1.5, spanGaps: true }))],
      }, data, this.box);
    }
  }

  return { el, when, duration, bytes, status, problem, stream, Chart };
})();
