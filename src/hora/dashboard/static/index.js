// The job list: live through /api/events; tick boxes and "Compare selected" overlays their metrics.
"use strict";

(() => {
  const { el, when, duration, status, stream } = hora;
  const body = document.querySelector("#jobs tbody");
  const button = document.getElementById("compare");
  const selected = new Set();
  let latest = [];

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
          ...(job.tuning_job ? [el("div", { class: "muted", text: "trial of tuning job " + job.tuning_job })] : [])),
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

  button.addEventListener("click", () => {
    const query = [...selected].map((n) => "job=" + encodeURIComponent(n)).join("&");
    window.location.href = "/compare?" + query;
  });
  stream("/api/events", { jobs: (data) => { latest = data.jobs; render(); } }, document.getElementById("live"));
  setInterval(() => { if (latest.some((j) => !j.done)) render(); }, 1000);  // running jobs' durations
})();
