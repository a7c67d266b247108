# Sourced by the device-call scripts under bench/ (device only): navdoctor's HTML report needs
# plotly.js, and the tree plus .gpu's wheels leave no room for it under the 64 MiB a device call
# carries. Uses .gpu/plotlyjs where it travels, else a stub package whose empty plotly.min.js
# lets diagnose write its (chartless) HTML report.
if [ -d .gpu/plotlyjs ]; then
  export PYTHONPATH=$PWD/.gpu/plotlyjs:${PYTHONPATH:-}
else
  mkdir -p /tmp/plotlystub/plotly/package_data && touch /tmp/plotlystub/plotly/__init__.py &&
    echo '/* plotly.js stub (device-only stand-in) */' > /tmp/plotlystub/plotly/package_data/plotly.min.js
  export PYTHONPATH=/tmp/plotlystub:${PYTHONPATH:-}
fi
