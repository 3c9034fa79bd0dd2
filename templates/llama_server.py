# Launcher for llama.cpp's HTTP server through the xllamacpp wheel; written and started by ralph
# (src/local/server.rs), one process per run. The server runs inside this process, so ending this
# process ends the server. Usage: python llama_server.py --model F --port N --threads N --ctx N
import argparse, os, signal, sys, threading

import xllamacpp as xlc

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--ctx", type=int, default=4096)
args = ap.parse_args()

parent = os.getppid()
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
signal.signal(signal.SIGINT, lambda *_: stop.set())

p = xlc.CommonParams()
p.model.path = args.model
p.n_ctx = args.ctx
p.n_parallel = 1  # one slot, so the whole context is available to ralph's one conversation
p.cpuparams.n_threads = args.threads
p.cpuparams_batch.n_threads = args.threads
p.hostnames = ["127.0.0.1"]  # loopback only
p.port = args.port
p.use_jinja = True  # the model's own chat template, with tools
p.ui = False
server = xlc.Server(p)  # returns once the HTTP server listens; /health is 200 when loaded
print(f"ralph-llama-server listening on {server.listening_address}", flush=True)

# Ralph also sets PR_SET_PDEATHSIG; polling the parent covers platforms without it.
while not stop.wait(0.5):
    if os.getppid() != parent:
        break
# Skip interpreter teardown: the server's native threads need no clean shutdown.
os._exit(0)
