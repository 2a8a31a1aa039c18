"""What the benchmark scripts that write a section of bench/RESULTS.md share:
the provenance of a run (commit, whether the tree was clean, the machine) and
the writing of a marked section, replaced in place on the next run."""
import json
import os
import platform
import re
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))


def git(*args):
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=HERE).stdout.strip()
    except OSError:
        return "?"


def commit():
    """The commit, with a note when tracked files differ from it (other than
    the results the benchmarks write: RESULTS.md and the sections' data, which
    an earlier part of the same run may have written)."""
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ":/", ":(top,exclude)bench/RESULTS.md", ":(top,exclude)bench/*.json")
    return git("rev-parse", "--short=12", "HEAD") + (" (with uncommitted changes)" if dirty else "")


def machine():
    """'AMD EPYC, 2 cores' (the CPU's model name, else the architecture)."""
    cpu = ""
    try:
        cpu = re.search(r"model name\s*:\s*(.*)", open("/proc/cpuinfo").read()).group(1)
    except (OSError, AttributeError):
        pass
    return f"{cpu or platform.machine()}, {os.cpu_count()} cores"


def write(name, title, lines, data, script=None):
    """Prints the table (`lines`), puts it under `## title` between the `name`
    markers of RESULTS.md (written by bench/NAME.py), and the data it came
    from into bench/NAME.json."""
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(HERE, name + ".json"), "w") as f:
        json.dump(data, f, indent=1)
    script = script or name + ".py"
    path = os.path.join(HERE, "RESULTS.md")
    text = open(path).read() if os.path.exists(path) else ""
    block = f"<!-- {name}:begin (written by bench/{script}) -->\n## {title}\n\n{table}\n<!-- {name}:end -->"
    if f"<!-- {name}:begin" in text:
        text = re.sub(rf"<!-- {name}:begin.*?<!-- {name}:end -->", lambda m: block, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(text)
