#!/usr/bin/env bash
# A run's trace tables as flat CSV files (jobs/export.py): jobs/export.sh RUN [OUT_DIR]
set -euo pipefail
exec /usr/bin/python3 "$(dirname "$0")/export.py" "$@"
