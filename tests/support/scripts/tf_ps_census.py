"""A job's script for the parameter_server distribution tests: what each host was given (TF_CONFIG, argv, SM_*),
who runs beside it, whether every parameter server answers; ``--mode kill-ps`` kills algo-2's server.
Run by tests/multiprocess/jobs/test_parameter_server.py and test_remote_hosts.py as a job's train.py."""

import json
import os
import signal
import socket
import sys
import time


def reachable(address):
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False

def children(pid):
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
                with open(f"/proc/{entry}/cmdline") as f:
                    cmd = f.read().replace("\0", " ")
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                out[int(entry)] = cmd
    return out

host = os.environ["SM_CURRENT_HOST"]
out_dir = sys.argv[sys.argv.index("--out") + 1]
config = json.loads(os.environ["TF_CONFIG"]) if "TF_CONFIG" in os.environ else None
ps = config["cluster"]["ps"] if config else []
deadline = time.monotonic() + 120
while not all(reachable(a) for a in ps) and time.monotonic() < deadline:
    time.sleep(0.2)
seen = {
    "tf_config": config, "argv": sys.argv[1:], "children": children(os.getppid()), "me": os.getpid(),
    "ps_up": [reachable(a) for a in ps],
    "sm": {k: v for k, v in os.environ.items() if k.startswith("SM_")},
}
mode = sys.argv[sys.argv.index("--mode") + 1]
if mode == "census" and host == "algo-1" and ps:  # a worker host keeps its server until the master ends
    while not os.path.exists(os.path.join(out_dir, "algo-2.json")) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    seen["ps_up_after_workers_ended"] = [reachable(a) for a in ps]
with open(os.path.join(out_dir, host + ".json"), "w") as f:
    json.dump(seen, f)
if mode == "kill-ps":
    if host == "algo-2":  # once algo-1 has written its census too: the job's failure stops its script
        while not os.path.exists(os.path.join(out_dir, "algo-1.json")) and time.monotonic() < deadline:
            time.sleep(0.2)
        ps_pid = next(p for p, c in seen["children"].items() if "hora.jobs._tf_ps" in c)
        os.kill(int(ps_pid), signal.SIGKILL)
    time.sleep(300)  # the wrapper stops algo-2's script when its server dies, hora run then stops algo-1's
