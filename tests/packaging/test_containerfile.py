"""docker/Containerfile's build stage installs a Debian package for every
find_package(<Name> ... REQUIRED) that a build with the Containerfile's own options runs
(issue 20: libssl-dev was missing, and only a build from the sources showed it, minutes in).
No container, no network: the CMake files are read from the top CMakeLists.txt down, through
add_subdirectory() and include() of the tree's own files, skipping the blocks of
if(<OPTION>) that the Containerfile's -D<OPTION>=OFF switches off (and their else() when
it says ON). Any other condition counts as true.
"""
import os
import re
import unittest

import pkgtest

CONTAINERFILE = os.path.join(pkgtest.SRC, "docker", "Containerfile")

# CMake package -> the Debian package that provides it. A new find_package(... REQUIRED)
# needs an entry here: an unknown name fails the test.
PROVIDERS = {
    "Threads": "build-essential",  # libc6-dev
    "fmt": "libfmt-dev",
    "spdlog": "libspdlog-dev",
    "CLI11": "libcli11-dev",
    "nlohmann_json": "nlohmann-json3-dev",
    "Boost": "libboost-dev",
    "OpenSSL": "libssl-dev",  # also its static libraries (DDP_STATIC_OPENSSL)
    "GTest": "libgtest-dev",
}


def strip_comments(text):
    """CMake source without its # comments (outside quoted arguments)."""
    out, quoted, i = [], False, 0
    while i < len(text):
        c = text[i]
        if c == "\\" and quoted:
            out.append(text[i:i + 2])
            i += 2
            continue
        if c == '"':
            quoted = not quoted
        elif c == "#" and not quoted:
            i = text.find("\n", i)
            if i < 0:
                break
            continue
        out.append(c)
        i += 1
    return "".join(out)


def commands(path):
    """(name in lower case, [arguments]) of each command in a CMake file, in order."""
    with open(path) as f:
        text = strip_comments(f.read())
    start = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
    pos = 0
    while m := start.search(text, pos):
        depth, j, quoted = 1, m.end(), False
        while depth and j < len(text):
            c = text[j]
            if c == '"' and text[j - 1] != "\\":
                quoted = not quoted
            elif c in "()" and not quoted:
                depth += 1 if c == "(" else -1
            j += 1
        args = re.findall(r'"(?:\\.|[^"])*"|[^\s()]+', text[m.end():j - 1])
        yield m.group(1).lower(), [a.strip('"') for a in args]
        pos = j


def containerfile_build_stage():
    """The build stage's apt-get packages and its cmake -D options ({name: bool})."""
    with open(CONTAINERFILE) as f:
        text = f.read().replace("\\\n", " ")
    stage = re.search(r"^FROM\s+\S+\s+AS\s+build\s*$(.*?)(?=^FROM\s)", text, re.S | re.M | re.I)
    assert stage, f"{CONTAINERFILE}: no 'FROM ... AS build' stage"
    stage = stage.group(1)
    packages = set()
    for m in re.finditer(r"apt-get install\s+(.*?)(?:&&|;|$)", stage, re.M):
        packages |= {w for w in m.group(1).split() if not w.startswith("-")}
    options = {k: v.upper() in ("ON", "TRUE", "1", "YES") for k, v in re.findall(r"-D(\w+)=(\w+)", stage)}
    return packages, options


class Walk:
    """The REQUIRED find_package calls a configure with `options` can run: {name: [file]}."""

    def __init__(self, options):
        self.options = options
        self.required = {}
        self.files = []

    def condition(self, args):
        """True/False when the Containerfile decides if(args), else None."""
        if len(args) == 1 and args[0] in self.options:
            return self.options[args[0]]
        if len(args) == 2 and args[0] == "NOT" and args[1] in self.options:
            return not self.options[args[1]]
        return None

    def file(self, path):
        self.files.append(os.path.relpath(path, pkgtest.SRC))
        here = os.path.dirname(path)
        stack = []  # per open if(): [this branch may run, an earlier branch surely ran]
        for name, args in commands(path):
            if name == "if":
                c = self.condition(args)
                stack.append([c is not False, c is True])
            elif name in ("elseif", "else"):
                c = self.condition(args) if name == "elseif" else True
                top = stack[-1]
                top[0] = not top[1] and c is not False
                top[1] = top[1] or (c is True and name == "elseif")
            elif name == "endif":
                stack.pop()
            elif not all(live for live, _ in stack):
                continue
            elif name == "find_package" and "REQUIRED" in args:
                self.required.setdefault(args[0], []).append(self.files[-1])
            elif name == "add_subdirectory":
                self.file(os.path.join(here, self.expand(args[0], here), "CMakeLists.txt"))
            elif name == "include":
                target = self.module(self.expand(args[0], here), here)
                if target:
                    self.file(target)
        return self

    @staticmethod
    def expand(arg, here):
        return (arg.replace("${CMAKE_CURRENT_LIST_DIR}", here).replace("${CMAKE_CURRENT_SOURCE_DIR}", here)
                .replace("${PROJECT_SOURCE_DIR}", pkgtest.SRC))

    @staticmethod
    def module(arg, here):
        """The tree's file that include(arg) reads; None for CMake's own modules."""
        if arg.endswith(".cmake"):
            return os.path.join(here, arg)
        mine = os.path.join(pkgtest.SRC, "cmake", arg + ".cmake")  # CMAKE_MODULE_PATH
        return mine if os.path.exists(mine) else None


class ContainerfileDependencies(unittest.TestCase):
    def setUp(self):
        self.packages, self.options = containerfile_build_stage()
        self.walk = Walk(self.options).file(os.path.join(pkgtest.SRC, "CMakeLists.txt"))

    def test_every_required_package_is_installed_in_the_build_stage(self):
        for name, where in sorted(self.walk.required.items()):
            with self.subTest(package=name):
                self.assertIn(name, PROVIDERS, f"find_package({name} ... REQUIRED) in {where}: add the Debian "
                                               f"package that provides it to PROVIDERS in {__file__}")
                self.assertIn(PROVIDERS[name], self.packages,
                              f"find_package({name} ... REQUIRED) in {where} needs {PROVIDERS[name]}, which "
                              f"docker/Containerfile's build stage does not install")

    def test_the_walk_sees_the_build(self):
        # A reader that found nothing would pass the test above: it must see what is known.
        self.assertEqual(self.options.get("DDP_BUILD_TESTS"), False)
        self.assertTrue({"Threads", "Boost", "OpenSSL", "spdlog"} <= set(self.walk.required), self.walk.required)
        self.assertIn("cmake/DdpDependencies.cmake", self.walk.files)
        self.assertIn("src/launcher/CMakeLists.txt", self.walk.files)
        self.assertNotIn("GTest", self.walk.required, "tests are off in the image")
        self.assertFalse([f for f in self.walk.files if f.startswith("tests/")], "tests are off in the image")
        self.assertTrue({"cmake", "build-essential"} <= self.packages, self.packages)

    def test_a_test_build_would_need_gtest(self):
        walk = Walk({**self.options, "DDP_BUILD_TESTS": True}).file(os.path.join(pkgtest.SRC, "CMakeLists.txt"))
        self.assertIn("GTest", walk.required)
        self.assertIn("tests/launcher/CMakeLists.txt", walk.files)


if __name__ == "__main__":
    pkgtest.main()
