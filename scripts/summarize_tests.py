"""Add up meson's testlog.json files and pytest's JUnit XML into one line,
"N passed, N failed, N skipped", and exit 1 if anything failed.
--extra-failed N adds N failures counted by the caller (a failed build)."""
import json
import sys
import xml.etree.ElementTree as ET

passed = failed = skipped = 0
args = sys.argv[1:]
if args[:1] == ["--extra-failed"]:
    failed += int(args[1])  # e.g. a build that failed before any test ran
    args = args[2:]
for path in args:
    try:
        if path.endswith(".json"):
            with open(path) as f:
                for line in f:
                    result = json.loads(line)["result"]
                    if result in ("OK", "EXPECTEDFAIL"):
                        passed += 1
                    elif result == "SKIP":
                        skipped += 1
                    else:
                        failed += 1
        else:
            root = ET.parse(path).getroot()
            suites = [root] if root.tag == "testsuite" else list(root)
            for s in suites:
                n = int(s.get("tests", 0))
                f = int(s.get("failures", 0)) + int(s.get("errors", 0))
                k = int(s.get("skipped", 0))
                passed += n - f - k
                failed += f
                skipped += k
    except (OSError, ValueError, ET.ParseError) as e:
        print(f"summarize: cannot read {path}: {e}")
        failed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
