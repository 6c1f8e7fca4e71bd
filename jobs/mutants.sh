#!/bin/bash
# Planted-bug testing (jobs/mutants.py): applies each bug of jobs/mutants.txt in a scratch copy of
# the tree, rebuilds, runs the test expected to catch it (and the whole suite for survivors), and
# prints killed / survived / did not build with a score. Arguments go to jobs/mutants.py.
exec /usr/bin/python3 "$(dirname "$0")/mutants.py" "$@"
