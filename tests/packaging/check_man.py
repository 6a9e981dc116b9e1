#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Keep the man pages in step with the programs' --help.

    check_man.py PAGE.scd PROGRAM [PAGE.scd PROGRAM]...

For each pair, runs `PROGRAM --help` and checks, against the scdoc source:
  - every option --help prints (-s, --socket, ...) appears in the page, and
    every option the page names is one --help prints;
  - an option whose --help line gives "(default D, MIN..MAX)" has an entry
    of its own in the page (a line starting *--option*, its text up to the
    next such line) that says "default D" and "MIN..MAX";
  - the commands --help lists under "Commands:" are the page's COMMANDS.
Prints every difference and exits 1 when there is one, else 0.
"""
import re
import subprocess
import sys

# A long option, or a one-letter short one, standing on its own: not the
# hyphen inside "per-thread" or "busy-polls".
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*[a-z0-9]|-[A-Za-z](?![\w-]))")
# "      --max-message N       bytes in one datagram (default 65536, 4096..1048576)"
DEFAULT = re.compile(r"^\s+(?:-\w, )?(--[\w-]+).*\(default ([^,()]+), (\d+\.\.\d+)\)\s*$")


def page_text(path):
    """The page's text without scdoc comments and escapes."""
    with open(path, encoding="utf-8") as f:
        lines = [ln for ln in f.read().splitlines() if not ln.startswith(";")]
    return [re.sub(r"\\(.)", r"\1", ln) for ln in lines]


def entry(lines, option):
    """The text of the page's entry for option: its term line up to the next
    term or heading."""
    out = None
    for ln in lines:
        if out is None:
            if re.match(r"^\*(-\w\*, \*)?%s\*" % re.escape(option), ln):
                out = [ln]
        elif ln.startswith(("*", "#")):
            break
        else:
            out.append(ln)
    return " ".join(" ".join(out or []).split())


def section_terms(lines, heading):
    """The *terms* that start lines in the page's section '# heading'."""
    terms, inside = set(), False
    for ln in lines:
        if ln.startswith("#"):
            inside = ln.strip("# ").upper() == heading
        elif inside:
            m = re.match(r"^\*([\w-]+)\*", ln)
            if m:
                terms.add(m.group(1))
    return terms


def help_commands(text):
    cmds, inside = set(), False
    for ln in text.splitlines():
        if ln.strip() == "Commands:":
            inside = True
        elif inside and not ln.strip():
            break
        elif inside:
            m = re.match(r"^  (\w+)\s{2,}", ln)
            if m:
                cmds.add(m.group(1))
    return cmds


def check(page, program):
    problems = []
    r = subprocess.run([program, "--help"], capture_output=True, text=True,
                       timeout=30, check=False)
    if r.returncode != 0:
        return ["%s --help exited %d" % (program, r.returncode)]
    help_text = r.stdout
    lines = page_text(page)
    in_help = set(OPTION.findall(help_text))
    in_page = set(OPTION.findall("\n".join(lines)))
    name = page.rsplit("/", 1)[-1]
    for opt in sorted(in_help - in_page):
        problems.append("%s: --help prints %s, the page does not" % (name, opt))
    for opt in sorted(in_page - in_help):
        problems.append("%s: the page names %s, --help does not" % (name, opt))
    for ln in help_text.splitlines():
        m = DEFAULT.match(ln)
        if m is None or m.group(1) not in in_page:
            continue
        opt, default, limits = m.groups()
        text = entry(lines, opt)
        if not text:
            problems.append("%s: %s has a default and a range in --help, but no "
                            "entry of its own in the page (a line starting *%s*) "
                            "to say them in" % (name, opt, opt))
            continue
        for want in ("default " + default, limits):
            if want not in text:
                problems.append("%s: %s: --help says '%s', the page's entry "
                                "does not: %r" % (name, opt, want, text))
    cmds, terms = help_commands(help_text), section_terms(lines, "COMMANDS")
    if cmds != terms:
        problems.append("%s: commands: --help lists %s, the page %s"
                        % (name, sorted(cmds), sorted(terms)))
    print("%s: %d options, %d commands checked against %s --help"
          % (name, len(in_help), len(cmds), program.rsplit("/", 1)[-1]))
    return problems


def main(argv):
    if len(argv) < 3 or len(argv) % 2 == 0:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    problems = []
    for page, program in zip(argv[1::2], argv[2::2]):
        problems += check(page, program)
    for p in problems:
        print("FAIL " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
