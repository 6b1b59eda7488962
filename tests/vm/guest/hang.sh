#!/bin/sh
# Scenario hang: never finishes; the harness must kill it at its timeout.
echo "hang: sleeping forever"
while :; do sleep 3600; done
