#!/bin/sh
# Installs the headless browser that the HTML-report tests use (Debian's `chromium`) when it is
# missing and this machine can: root, with apt-get. Otherwise it says why and exits 0, and the
# browser tests skip with that reason. It never fails the test command.
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
        || [ -n "${NAVDOCTOR_CHROMIUM:-}" ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "install-browser: chromium is missing and this is not root: the browser tests will skip" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-browser: chromium is missing and there is no apt-get: the browser tests will skip" >&2
    exit 0
fi
echo "install-browser: installing chromium with apt-get" >&2
apt-get update -qq >/dev/null 2>&1 || echo "install-browser: apt-get update failed; trying the cached lists" >&2
if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; then
    echo "install-browser: apt-get could not install chromium: the browser tests will skip" >&2
fi
exit 0
