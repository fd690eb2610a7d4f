#!/bin/sh
# A child that is not an environment at all: it prints text and exits.
echo "Usage: garbage.sh [options]"
echo "error: no such option" >&2
exit 2
