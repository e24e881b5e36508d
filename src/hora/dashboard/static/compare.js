// Several jobs' metrics overlaid: one chart per metric name, one series per job.
"use strict";

(() => {
  const { el, status, stream, Chart } = hora;
  const names = new URLSearchParams(window.location.search).getAll("job");
  const jobs = {}, rows = {}, charts = new Map();
  const $ = (id) => document.getElementById(id);

  const redraw = () => {
    $("jobs").tBodies[0].replaceChildren(...names.filter((n) => jobs[n]).map((n) => el("tr", {},
      el("td", {}, el("a", { href: "/jobs/" + encodeURIComponent(n), text: n })),
      el("td", {}, status(jobs[n])),
      el("td", { class: "muted", text: Object.entries(jobs[n].hyperparameters)
        .map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(" ") }))));
    const series = {};
    for (const n of names) {
      if (!jobs[n] || !rows[n]) continue;
      const start = jobs[n].started || jobs[n].created;
      const lowest = {};
      for (const [metric, , , , rank] of rows[n]) lowest[metric] = Math.min(lowest[metric] ?? rank, rank);
      for (const [metric, value, time, , rank] of rows[n]) {
        if (rank === lowest[metric]) ((series[metric] ??= {})[n] ??= []).push([time - start, value]);
      }
    }
    for (const metric of Object.keys(series).sort()) {
      if (!charts.has(metric)) charts.set(metric, new Chart($("metrics"), metric, "seconds since start"));
      charts.get(metric).update(series[metric]);
    }
    $("no-metrics").classList.toggle("hidden", charts.size > 0);
  };

  for (const n of names) {
    stream(`/api/jobs/${encodeURIComponent(n)}/events?logs=0`, {
      job: (data) => { jobs[n] = data; redraw(); },
      metrics: (data) => { rows[n] = (data.reset ? [] : rows[n] || []).concat(data.rows); redraw(); },
    }, $("live"), `/api/jobs/${encodeURIComponent(n)}`);
  }
})();
