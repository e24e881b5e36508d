// The job and tuning job lists: live through /api/events; tick boxes and "Compare selected" overlays their metrics.
"use strict";

(() => {
  const { el, when, duration, status, stream } = hora;
  const body = document.querySelector("#jobs tbody");
  const button = document.getElementById("compare");
  const selected = new Set();
  let latest = [], tuning = [];
  const tuningLink = (name) => el("a", { href: "/tuning/" + encodeURIComponent(name), text: name });

  const render = () => {
    body.replaceChildren(...latest.map((job) => {
      const box = el("input", { type: "checkbox", "aria-label": "select " + job.name });
      box.checked = selected.has(job.name);
      box.addEventListener("change", () => {
        if (box.checked) selected.add(job.name); else selected.delete(job.name);
        button.disabled = selected.size < 1;
      });
      const hp = Object.entries(job.hyperparameters).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(" ");
      return el("tr", { "data-job": job.name },
        el("td", {}, box),
        el("td", {}, el("a", { href: "/jobs/" + encodeURIComponent(job.name), text: job.name }),
          ...(job.tuning_job
            ? [el("div", { class: "muted" }, "trial of tuning job ", tuningLink(job.tuning_job))] : [])),
        el("td", {}, status(job)),
        el("td", { text: job.secondary_status }),
        el("td", { text: `${job.hosts} x ${job.processes_per_host}` }),
        el("td", { text: when(job.created) }),
        el("td", { class: "num", text: duration(job) }),
        el("td", { text: job.entry_point || "" }),
        el("td", { class: "muted", text: hp }));
    }));
    document.getElementById("empty").classList.toggle("hidden", latest.length > 0);
  };

  const renderTuning = () => {
    const value = (v) => String(+Number(v).toPrecision(6));
    document.querySelector("#tuning tbody").replaceChildren(...tuning.map((t) => el("tr", { "data-tuning": t.name },
      el("td", {}, tuningLink(t.name)),
      el("td", {}, status(t)),
      el("td", { text: t.strategy }),
      el("td", { text: `${t.objective.type} ${t.objective.name}` }),
      el("td", { class: "num", text: `${t.trials_done}/${t.max_jobs}` }),
      el("td", {}, ...(t.best ? [value(t.best.objective) + " (", el("a", {
        href: "/jobs/" + encodeURIComponent(t.best.name), text: t.best.name }), ")"] : ["-"])),
      el("td", { text: when(t.created) }),
      el("td", { class: "num", text: duration({ started: t.created, ended: t.ended }) }))));
    document.getElementById("tuning-section").classList.toggle("hidden", tuning.length === 0);
  };

  button.addEventListener("click", () => {
    const query = [...selected].map((n) => "job=" + encodeURIComponent(n)).join("&");
    window.location.href = "/compare?" + query;
  });
  stream("/api/events", {
    jobs: (data) => { latest = data.jobs; render(); },
    tuning: (data) => { tuning = data.tuning_jobs; renderTuning(); },
  }, document.getElementById("live"));
  setInterval(() => {  // running jobs' durations
    if (latest.some((j) => !j.done)) render();
    if (tuning.some((t) => !t.done)) renderTuning();
  }, 1000);
})();
