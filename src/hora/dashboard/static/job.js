// A job's page: everything arrives through /api/jobs/NAME/events (state first, then what changed).
"use strict";

(() => {
  const { el, when, duration, bytes, status, stream, Chart } = hora;
  const name = decodeURIComponent(window.location.pathname.split("/").pop());
  const api = "/api/jobs/" + encodeURIComponent(name);
  const $ = (id) => document.getElementById(id);
  const MAX_LOG_LINES = 5000;
  document.title = name + " - hora";
  $("crumb").textContent = name;
  $("name").textContent = name;

  let job = null, source = null, filtersReady = false;
  const metricCharts = new Map(), systemCharts = new Map();
  let metricSeries = {}, systemSeries = {};

  const fact = (k, v) => [el("dt", { text: k }), el("dd", { text: v })];

  const showJob = (data) => {
    job = data;
    $("status").replaceChildren(status(job));
    const hp = Object.entries(job.hyperparameters).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join("  ");
    $("facts").replaceChildren(...[
      fact("Secondary status", job.secondary_status),
      fact("Hosts", `${job.hosts} x ${job.processes_per_host} process(es)`),
      fact("Entry point", job.entry_point || "-"),
      fact("Created", when(job.created)),
      fact("Duration", duration(job)),
      fact("Attempts", String(job.attempts)),
      fact("Exit code", job.exit_code === null ? "-" : String(job.exit_code)),
      fact("Hyperparameters", hp || "-"),
      ...(job.tuning_job ? [[el("dt", { text: "Tuning job" }), el("dd", {}, el("a", {
        href: "/tuning/" + encodeURIComponent(job.tuning_job), text: job.tuning_job }))]] : []),
      fact("Environment", job.environment_names.length ? job.environment_names.join(", ") + " (values not shown)" : "-"),
    ].flat());
    $("failure").classList.toggle("hidden", !job.failure_reason);
    $("failure-reason").textContent = job.failure_reason || "";
    $("history").tBodies[0].replaceChildren(...job.transitions.map((t) => el("tr", {},
      el("td", { text: when(t.time) }), el("td", { text: t.status }), el("td", { text: t.secondary_status }),
      el("td", { text: t.message }))));
    $("downloads").tBodies[0].replaceChildren(...job.downloads.map((d) => el("tr", {},
      el("td", {}, el("a", { href: `${api}/download/${encodeURIComponent(d.key)}`, text: d.label })),
      el("td", { class: "num", text: bytes(d.size) }))));
    $("no-downloads").classList.toggle("hidden", job.downloads.length > 0);
    $("spec").textContent = JSON.stringify(job.spec, null, 2);
    if (!filtersReady) {
      filtersReady = true;
      for (const h of ["job", ...job.host_names]) $("log-host").append(el("option", { value: h, text: h }));
      for (let r = 0; r < job.hosts * job.processes_per_host; r += 1) {
        $("log-rank").append(el("option", { value: String(r), text: String(r) }));
      }
    }
  };

  const draw = (charts, series, parent, empty, xLabel) => {
    for (const metric of Object.keys(series).sort()) {
      if (!charts.has(metric)) charts.set(metric, new Chart(parent, metric, xLabel));
      charts.get(metric).update(series[metric]);
    }
    empty.classList.toggle("hidden", charts.size > 0);
  };

  const addMetrics = (data) => {
    if (data.reset) metricSeries = {};
    for (const [metric, value, time, host, rank, attempt] of data.rows) {
      const label = `${host} rank ${rank}` + (attempt > 1 ? ` attempt ${attempt}` : "");
      ((metricSeries[metric] ??= {})[label] ??= []).push([time, value]);
    }
    draw(metricCharts, metricSeries, $("metrics"), $("no-metrics"), "time");
  };

  const addSystem = (data) => {
    if (data.reset) systemSeries = {};
    for (const [host, time, metric, value] of data.rows) ((systemSeries[metric] ??= {})[host] ??= []).push([time, value]);
    draw(systemCharts, systemSeries, $("system"), $("no-system"), "time");
  };

  const addLog = (data) => {
    const log = $("log");
    if (data.reset) log.textContent = "";
    if (!data.lines.length) return;
    log.append(document.createTextNode(data.lines.join("\n") + "\n"));
    while (log.childNodes.length > 1 && log.textContent.split("\n").length > MAX_LOG_LINES) log.firstChild.remove();
    if ($("follow").checked) log.scrollTop = log.scrollHeight;
  };

  const connect = () => {
    if (source) source.close();
    const params = new URLSearchParams();
    if ($("log-host").value) params.set("host", $("log-host").value);
    if ($("log-rank").value) params.set("rank", $("log-rank").value);
    source = stream(`${api}/events?${params}`, { job: showJob, metrics: addMetrics, system: addSystem, log: addLog },
      $("live"), `${api}/logs?lines=0&${params}`);
  };

  $("log-host").addEventListener("change", connect);
  $("log-rank").addEventListener("change", connect);
  setInterval(() => { if (job && !job.done) showJob(job); }, 1000);  // the running duration
  connect();
})();
