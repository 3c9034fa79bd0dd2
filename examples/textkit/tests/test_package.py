import unittest

import textkit


class PackageTest(unittest.TestCase):
    def test_version_is_a_dotted_string(self):
        parts = textkit.__version__.split(".")
        self.assertEqual(len(parts), 3)
        self.assertTrue(all(p.isdigit() for p in parts))


if __name__ == "__main__":
    unittest.main()
