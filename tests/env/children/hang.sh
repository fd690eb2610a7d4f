#!/bin/sh
# A child that starts a grandchild in its process group, answers the handshake and then never
# replies: tests/env checks that a timeout kills the whole group.
sleep 1000 &
echo '{"protocol": "rlforge.env", "version": 1}'
read -r request
sleep 1000
