"""The man page and the bash and zsh completions, generated at build time from ddprun's flag
table, name every flag that --help names, render without warnings, and really complete."""
import gzip
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import pkgtest
from pkgtest import BUILD, run

SHARE = os.path.join(BUILD, "share")
MAN = os.path.join(SHARE, "man/man1/ddprun.1")
BASH = os.path.join(SHARE, "bash-completion/completions/ddprun")
ZSH = os.path.join(SHARE, "zsh/vendor-completions/_ddprun")
DDPRUN = os.environ.get("DDPRUN", os.path.join(BUILD, "bin/ddprun"))


def flags():
    """(long, short, kind, choices) for each row of the table, from ddprun-docgen."""
    with open(os.path.join(SHARE, "ddprun/flags.tsv")) as f:
        return [tuple(line.rstrip("\n").split("\t")) for line in f if line.strip()]


def read(path):
    with open(path) as f:
        return f.read()


def bash_complete(*words):
    """COMPREPLY of _ddprun for the command line `words` (the last one is being completed)."""
    script = (f'source {BASH}\nCOMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _ddprun\n'
              'printf "%s\\n" "${COMPREPLY[@]}"\n')
    p = run(["bash", "--norc", "--noprofile", "-c", script, "bash", *words], timeout=30)
    return [l for l in p.stdout.splitlines() if l]


ZPTY = r"""
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "fpath=($1 \$fpath); autoload -Uz compinit; compinit -u -D; PROMPT='%% ';\
 zstyle ':completion:*' list-prompt ''; unsetopt beep; print RE\"\"ADY"
zpty -r -m z out '*READY*'
zpty -n -w z "$2"$'\t'
out=
for i in {1..30}; do sleep 0.1; while zpty -r -t z chunk; do out+=$chunk; done; done
print -r -- "$out"
zpty -d z
"""


def zsh_complete(line):
    """What an interactive zsh shows after `line<TAB>` with _ddprun on its fpath. (READY is
    printed as RE""ADY: the echo of that line must not pass for its output, or the TAB
    comes before compinit has run.)"""
    p = run(["zsh", "-f", "-c", ZPTY, "zsh", os.path.dirname(ZSH), line], timeout=60)
    return re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]|\x08|\r", "", p.stdout)


class Docs(unittest.TestCase):
    def test_every_flag_in_help_man_and_completions(self):
        table = flags()
        self.assertGreater(len(table), 25)
        helptext = run([DDPRUN, "--help"], timeout=30).stdout
        man = read(MAN)
        with gzip.open(MAN + ".gz", "rt") as f:
            self.assertEqual(f.read(), man)
        bash, zsh = read(BASH), read(ZSH)
        for long, short, kind, choices in table:
            with self.subTest(flag=long):
                self.assertRegex(helptext, re.escape(long) + r"\b")
                self.assertTrue(long.replace("-", "\\-") in man, f"{long} not in the man page")
                self.assertRegex(bash, re.escape(long) + r"[ '\n)]")
                self.assertRegex(zsh, re.escape(long) + r"[='\[}]")
                if short != "-":
                    self.assertIn(f"\\fB\\{short}\\fR", man)
                    self.assertIn(f"{short}:{long}", bash)
                for choice in choices.split():
                    self.assertTrue(choice.replace("-", "\\-") in man, f"{long}: value {choice} not in the man page")
        # and nothing in --help that the table lacks
        helped = {f.replace("_", "-") for f in re.findall(r"(?<![\w-])--[a-z][a-z0-9_-]+", helptext)}
        self.assertEqual(helped - {t[0] for t in table}, set())

    def test_man_page_renders_without_warnings(self):
        if not shutil.which("man"):
            self.skipTest("man-db is not installed")
        env = {**os.environ, "MANWIDTH": "80", "LC_ALL": "C.UTF-8"}
        p = subprocess.run(["man", "--warnings", "-l", MAN], capture_output=True, text=True, env=env, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr, "")
        text = p.stdout
        for section in ("NAME", "SYNOPSIS", "OPTIONS", "WORKER ENVIRONMENT", "EXIT STATUS", "SIGNALS", "FILES",
                        "SLURM", "CONTAINERS", "EXAMPLES"):
            self.assertRegex(text, rf"(?m)^{section}$")
        version = run([DDPRUN, "--version"], timeout=30).stdout.split()[1]
        self.assertIn(f"ddprun {version}", text)

    def test_bash_completes_options_and_values(self):
        self.assertEqual(bash_complete("ddprun", "--rdzv-b"), ["--rdzv-backend"])
        self.assertEqual(bash_complete("ddprun", "--rdzv-backend", ""), ["static", "c10d", "etcd", "etcd-v2"])
        self.assertEqual(bash_complete("ddprun", "--rdzv-backend", "c"), ["c10d"])
        self.assertEqual(bash_complete("ddprun", "--rdzv-backend", "=", "c"), ["c10d"])   # --rdzv-backend=c
        self.assertEqual(bash_complete("ddprun", "--rdzv_backend", "s"), ["static"])      # underscore spelling
        self.assertEqual(bash_complete("ddprun", "--rdzv-back", "s"), ["static"])         # unambiguous prefix
        self.assertEqual(bash_complete("ddprun", "-r", ""), ["0", "1", "2", "3"])
        self.assertEqual(bash_complete("ddprun", "--log-l"), ["--log-line-prefix-template", "--log-level"])
        self.assertEqual(bash_complete("ddprun", "--nnodes", "2", "--standalone", "--nproc-per-node", "a"), ["auto"])
        self.assertEqual(bash_complete("ddprun", "--nnodes", ""), [])  # a free value: nothing to offer
        with tempfile.TemporaryDirectory() as d:
            os.mkdir(os.path.join(d, "logsdir"))
            open(os.path.join(d, "logsfile"), "w").close()
            self.assertEqual(bash_complete("ddprun", "--log-dir", f"{d}/logs"), [f"{d}/logsdir"])
            # after the script every word is the script's: files, never ddprun's options
            self.assertEqual(bash_complete("ddprun", "--nnodes", "1", "train.py", "--rdzv"), [])
            self.assertEqual(sorted(bash_complete("ddprun", "train.py", f"{d}/logs")),
                             [f"{d}/logsdir", f"{d}/logsfile"])

    def test_zsh_completes_options_and_values(self):
        if not shutil.which("zsh"):
            self.skipTest("zsh is not installed (scripts/setup.sh installs it)")
        run(["zsh", "-n", ZSH], timeout=30)
        self.assertIn("ddprun --rdzv-backend=", zsh_complete("ddprun --rdzv-b"))
        shown = zsh_complete("ddprun --rdzv-backend ")
        for v in ("static", "c10d", "etcd-v2"):
            self.assertRegex(shown, rf"(?m)(^|\s){v}(\s|$)")
        shown = zsh_complete("ddprun --nproc-per-node ")
        self.assertRegex(shown, r"auto\s+cpu\s+gpu")


class KubernetesManifests(unittest.TestCase):
    """examples/kubernetes/*.yaml parse, have the fields the operators need, and set only
    variables and flags that ddprun knows."""

    def test_manifests(self):
        import yaml
        folder = os.path.join(pkgtest.SRC, "examples/kubernetes")
        names = {t[0] for t in flags()}
        pets = {"PET_" + n[2:].replace("-", "_").upper() for n in names} - {"PET_HELP", "PET_VERSION"}
        kinds = {}
        for f in sorted(os.listdir(folder)):
            if not f.endswith(".yaml"):
                continue
            with open(os.path.join(folder, f)) as fh:
                docs = [d for d in yaml.safe_load_all(fh) if d]
            self.assertTrue(docs, f)
            for doc in docs:
                self.assertIn("apiVersion", doc, f)
                kinds[doc["kind"]] = doc
                for c in containers(doc):
                    with self.subTest(file=f, container=c["name"]):
                        for e in c.get("env", []):
                            if e["name"].startswith("PET_"):
                                self.assertIn(e["name"], pets)
                        for a in c.get("args", []):
                            if not a.startswith("-"):
                                break  # the training script: the rest is its own
                            self.assertIn(a.split("=")[0], names)
        self.assertEqual(set(kinds), {"PyTorchJob", "JobSet", "ConfigMap"})
        pj = kinds["PyTorchJob"]["spec"]
        for role in ("Master", "Worker"):
            c = pj["pytorchReplicaSpecs"][role]["template"]["spec"]["containers"][0]
            self.assertEqual(c["name"], "pytorch")  # the training operator requires it
            self.assertNotIn("command", c)  # ddprun stays the ENTRYPOINT
        js = kinds["JobSet"]["spec"]
        env = {e["name"] for c in containers(kinds["JobSet"]) for e in c.get("env", [])}
        self.assertLessEqual({"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR"}, env)
        self.assertTrue(js["network"]["enableDNSHostnames"])


def containers(doc):
    """Every container spec anywhere in a manifest."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k == "containers":
                yield from v
            else:
                yield from containers(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from containers(v)


if __name__ == "__main__":
    pkgtest.main()
