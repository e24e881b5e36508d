// A tuning job's page: everything arrives through /api/tuning/NAME/events ("tuning": the tuning job and its trials;
// "series": the trials' objective values by epoch, first all, then only the trials whose values changed).
"use strict";

(() => {
  const { el, when, duration, status, stream, Chart } = hora;
  const name = decodeURIComponent(window.location.pathname.split("/").pop());
  const api = "/api/tuning/" + encodeURIComponent(name);
  const $ = (id) => document.getElementById(id);
  document.title = name + " - hora tuning";
  $("crumb").textContent = "tuning job " + name;
  $("name").textContent = name;

  let tuning = null, series = {}, sort = "start", objectiveChart = null, epochChart = null;
  const SORTS = { start: "best", best: "worst", worst: "start" };

  const value = (v) => (v === null || v === undefined ? "-" : String(+Number(v).toPrecision(6)));
  const jobLink = (job) => el("a", { href: "/jobs/" + encodeURIComponent(job), text: job });
  const fact = (k, ...v) => [el("dt", { text: k }), el("dd", {}, ...v)];
  const maximize = () => tuning.objective.type === "Maximize";
  const rangeText = (r) => (r.values ? `${r.name}: one of ${r.values.join(", ")}`
    : `${r.name}: ${r.min} .. ${r.max} (${r.scaling})`);
  // a tuned value as the trial got it, numbers shortened to 6 significant digits for reading
  const tunedText = (v) => (typeof v === "number" ? value(v) : String(v));
  const pairs = (o) => Object.entries(o).map(([k, v]) => `${k}=${tunedText(v)}`).join("  ");

  const showFacts = () => {
    const t = tuning, limits = t.limits;
    $("status").replaceChildren(status(t));
    $("facts").replaceChildren(...[
      fact("Strategy", t.strategy + (t.random_seed === null ? "" : ` (seed ${t.random_seed})`)),
      fact("Objective", `${t.objective.type} ${t.objective.name}`),
      fact("Trials", `${t.trials_done} of ${t.max_jobs} ended (${t.trials_started} started), at most `
        + `${limits.max_parallel_jobs} at once`
        + (limits.max_runtime_in_seconds ? `, within ${limits.max_runtime_in_seconds} s` : "")),
      fact("Early stopping", t.early_stopping),
      fact("Ranges", t.ranges.map(rangeText).join("; ") || "-"),
      fact("Static hyperparameters", pairs(t.static_hyperparameters) || "-"),
      fact("Metric definitions", t.metric_definitions.map((m) => `${m.name}: ${m.regex}`).join("; ") || "-"),
      fact("Created", when(t.created)),
      fact("Ended", when(t.ended)),
      fact("Duration", duration({ started: t.created, ended: t.ended })),
    ].flat());
    const reason = t.failure_reason || "";
    $("failure").classList.toggle("hidden", !reason);
    $("failure-title").textContent = t.status === "Failed" ? "Failure reason" : "Stop reason";
    $("failure-reason").textContent = reason;
    $("no-best").classList.toggle("hidden", t.best !== null);
    $("best").replaceChildren(...(t.best === null ? [] : [
      fact("Trial", jobLink(t.best.name)),
      fact(t.objective.name, value(t.best.objective)),
      fact("Hyperparameters", pairs(t.best.tuned) || "-"),
    ].flat()));
  };

  const sorted = () => {
    const trials = [...tuning.trials];
    if (sort === "start") return trials;
    const sign = (sort === "best") === maximize() ? -1 : 1;
    // trials without an objective (running, failed) go last either way
    return trials.sort((a, b) => (a.objective === null) - (b.objective === null)
      || sign * ((a.objective ?? 0) - (b.objective ?? 0)) || a.index - b.index);
  };

  const showTrials = () => {
    const names = tuning.ranges.map((r) => r.name);
    const arrow = { start: "", best: " \u2193 best first", worst: " \u2191 worst first" }[sort];
    const objective = el("th", { id: "sort-objective", class: "sortable", title: "sort by the objective",
      text: "Objective" + arrow });
    objective.addEventListener("click", () => { sort = SORTS[sort]; showTrials(); });
    $("trials").tHead.replaceChildren(el("tr", {}, el("th", { text: "#" }), el("th", { text: "Trial" }),
      ...names.map((n) => el("th", { text: n })), el("th", { text: "Status" }), objective,
      el("th", { text: "Epochs" }), el("th", { text: "Started" }), el("th", { text: "Ended" }),
      el("th", { text: "Elapsed" }), el("th", { text: "Reason" })));
    const best = tuning.best && tuning.best.name;
    $("trials").tBodies[0].replaceChildren(...sorted().map((t) => el("tr",
      { "data-trial": t.name, class: t.name === best ? "best" : "" },
      el("td", { class: "num", text: String(t.index) }),
      el("td", {}, jobLink(t.name), ...(t.name === best ? [el("span", { class: "tag", text: "best" })] : [])),
      ...names.map((n) => el("td", { text: t.tuned[n] === undefined ? "" : tunedText(t.tuned[n]) })),
      el("td", {}, status(t)),
      el("td", { class: "num objective", text: value(t.objective) }),
      el("td", { class: "num", text: String(t.epochs) }),
      el("td", { text: when(t.started) }),
      el("td", { text: when(t.ended) }),
      el("td", { class: "num", text: duration(t) }),
      el("td", { class: "muted", text: t.reason ? t.reason.split("\n")[0] : "" }))));
    $("no-trials").classList.toggle("hidden", tuning.trials.length > 0);
    $("compare").href = "/compare?" + tuning.trials.map((t) => "job=" + encodeURIComponent(t.name)).join("&");
    $("compare").classList.toggle("hidden", tuning.trials.length === 0);
  };

  const showCharts = () => {
    if (!tuning) return;
    const metric = tuning.objective.name;
    const ended = tuning.trials.filter((t) => t.objective !== null && t.status !== "InProgress");
    if (ended.length) {
      objectiveChart ??= new Chart($("objective"), `${metric}: final value by trial`, "trial", true);
      let best = null;
      const bests = ended.map((t) => {
        best = best === null ? t.objective : (maximize() ? Math.max : Math.min)(best, t.objective);
        return [t.index, best];
      });
      objectiveChart.update({ "final objective": ended.map((t) => [t.index, t.objective]), "best so far": bests });
    }
    const byEpoch = {};
    for (const t of tuning.trials) {
      const values = series[t.name] || [];
      if (values.length) byEpoch[t.name] = values.map((v, i) => [i + 1, v]);
    }
    if (Object.keys(byEpoch).length) {
      epochChart ??= new Chart($("epochs"), `${metric} by epoch`, "epoch", true);
      epochChart.update(byEpoch);
    }
    $("no-objective").classList.toggle("hidden", ended.length > 0 || Object.keys(byEpoch).length > 0);
  };

  const showTuning = (data) => {
    tuning = data;
    showFacts();
    showTrials();
    showCharts();
  };

  const addSeries = (data) => {
    if (data.reset) series = {};
    Object.assign(series, data.series);
    showCharts();
  };

  stream(`${api}/events`, { tuning: showTuning, series: addSeries }, $("live"), api);
  setInterval(() => { if (tuning && !tuning.done) { showFacts(); showTrials(); } }, 1000);  // running durations
})();
