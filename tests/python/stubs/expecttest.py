"""expecttest.py - a minimal stand-in for the `expecttest` module, which Debian
does not package but torch.testing._internal.common_utils imports.

Only what torch's distributed test suite touches: the ACCEPT flag and a
TestCase with assertExpectedInline (compares, never rewrites sources)."""
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    longMessage = True

    def assertExpectedInline(self, actual, expect, skip=0):  # noqa: N802 - upstream name
        self.assertMultiLineEqual(expect.strip(), actual.strip())

    def assertExpectedRaisesInline(self, exc_type, callable_, expect, *args, **kwargs):  # noqa: N802
        try:
            callable_(*args, **kwargs)
        except exc_type as e:
            self.assertExpectedInline(str(e), expect)
            return
        self.fail(f"Did not raise when expected to: {exc_type.__name__}")
