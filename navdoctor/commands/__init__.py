"""What each command does, one function per command: analyze.run, diagnose.run, verify.run,
compare.run and the rules_* functions of rules.py. Each returns the exit code; cli.py parses
the command line, calls one of them and maps errors to exit codes (docs/report.md, "Exit
codes"). outputs.py holds what the commands share: output paths checked before any work, and
the reports written and announced."""
