#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Run test_* functions without pytest.

    run_tests.py                 every tests/python/test_*.py
    run_tests.py FILE [NAME...]  one file, optionally some of its tests

Prints one line per test and 'N passed, N failed, N skipped'; exits 1 on a
failure, 77 when everything was skipped, else 0. A test skips by raising
tbtest.Skip (or unittest.SkipTest)."""
import glob
import importlib.util
import os
import sys
import time
import traceback
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tbtest  # noqa: E402


def load(path):
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv):
    if len(argv) > 1:
        files, only = [argv[1]], set(argv[2:])
    else:
        files, only = sorted(glob.glob(os.path.join(HERE, "test_*.py"))), set()
    passed = failed = skipped = 0
    for path in files:
        try:
            mod = load(path)
        except (tbtest.Skip, unittest.SkipTest) as e:
            print("SKIP %s: %s" % (os.path.basename(path), e), flush=True)
            skipped += 1
            continue
        tests = [(n, f) for n, f in vars(mod).items()
                 if n.startswith("test_") and callable(f) and (not only or n in only)]
        for name, fn in tests:
            label = "%s::%s" % (os.path.basename(path), name)
            t0 = time.monotonic()
            try:
                fn()
            except (tbtest.Skip, unittest.SkipTest) as e:
                skipped += 1
                print("SKIP %s: %s" % (label, e), flush=True)
            except Exception:
                failed += 1
                print("FAIL %s" % label, flush=True)
                traceback.print_exc()
            else:
                passed += 1
                print("ok   %s (%.2fs)" % (label, time.monotonic() - t0), flush=True)
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    if failed:
        return 1
    if passed == 0 and skipped:
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
