"""Action sources used by the platform tests."""

ECHO = """\
def main(args):
    print("hello", args.get("name", "world"))
    return {"echo": args}
"""

# Its arguments and the variables of its environment that start with FAASDL_CONTRACT_.
ENVIRONMENT = """\
import os

def main(args):
    env = {k: v for k, v in os.environ.items() if k.startswith("FAASDL_CONTRACT_")}
    return {"args": args, "env": env}
"""

# The names of the FAASDL_ variables of its environment.
FAASDL_NAMES = """\
import os

def main(args):
    return {"names": sorted(k for k in os.environ if k.startswith("FAASDL_"))}
"""

WARMABLE_SLEEP = """\
import time

def main(args):
    if args.get("warmup"):
        time.sleep(float(args.get("warm_s", 0)))
        if args.get("fail"):
            raise RuntimeError("the warm-up failed")
        return {"warm": True}
    time.sleep(float(args.get("seconds", 0)))
    return {"slept": args.get("seconds", 0)}
"""

RAISES = """\
def main(args):
    raise ValueError("bad input: " + str(args.get("n")))
"""

CRASHES = """\
import os

def main(args):
    os._exit(3)
"""

# Allocates in 4 MB steps every 10 ms up to `mb` MB, printing the time and its RSS after each
# step; the pages are written, so they are resident.
ALLOCATES = """\
import time

def rss_mb():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096 / 2**20

def main(args):
    held = []
    while len(held) * 4 < args["mb"]:
        held.append(b"\\x01" * (4 * 2**20))
        print(f"step {time.time():.6f} {rss_mb():.1f}", flush=True)
        time.sleep(0.01)
    return {"allocated_mb": len(held) * 4}
"""

NOT_A_DICT = """\
def main(args):
    return 42
"""

BROKEN = """\
import no_such_module_anywhere

def main(args):
    return {}
"""

BIG_RESULT = """\
def main(args):
    return {"blob": "x" * args["bytes"]}
"""

# A faasdl action (faasdl.actionkit.serve) that waits `seconds` in a function of its own.
FAASDL_STUCK = """\
import time

from faasdl.actionkit import serve

def stuck_waiting(args):
    time.sleep(float(args["seconds"]))
    return {"waited": args["seconds"]}

def main(args):
    return serve(args, stuck_waiting)
"""

# Leaves a file in the temporary directory (as TensorFlow leaves its traced functions' sources
# for an exit hook), or sleeps `seconds`.
LEAVES_A_TEMP_FILE = """\
import tempfile
import time

def main(args):
    if args.get("seconds"):
        time.sleep(float(args["seconds"]))
        return {}
    fd, path = tempfile.mkstemp(prefix="left-behind-")
    return {"path": path}
"""

# A faasdl action busy in Python (calls starting and returning all the time) for `seconds`.
FAASDL_BUSY = """\
import threading
import time

from faasdl.actionkit import serve

def churn(depth):
    return churn(depth - 1) + 1 if depth else 0

def churning(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        churn(50)

def busy_churning(args):
    others = [threading.Thread(target=churning, args=(float(args["seconds"]),), daemon=True)
              for _ in range(3)]
    for other in others:
        other.start()
    churning(float(args["seconds"]))
    return {}

def main(args):
    return serve(args, busy_churning)
"""
