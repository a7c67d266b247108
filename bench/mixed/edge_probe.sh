# device: verify --classify at DeepLabV3 MobileNetV3 data amounts near the loader's line
set -u
export PYTHONUNBUFFERED=1
source bench/device_plotly_stub.sh
for amt in ${AMTS}; do
  python3 -m navdoctor verify --classify --repeats 4 --warmup 4 --steps 12 --remedy num_workers --priming-runs 0 \
    --json $OUT/verify_dlv3_$amt.json -q bench/mixed/mix.py --model deeplabv3mnv3 --batch 32 \
    --kind data --amount $amt --fix none --steps 40 > $OUT/verify_dlv3_$amt.txt 2>&1
  echo "amount $amt rc $? ${SECONDS}s"; tail -12 $OUT/verify_dlv3_$amt.txt
  [ $SECONDS -gt $((LIMIT - 120)) ] && break
done
