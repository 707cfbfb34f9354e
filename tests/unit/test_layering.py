"""The pipeline package stands alone: importing it pulls in neither Faust nor aiohttp."""

import subprocess
import sys


def test_pipeline_imports_nothing_from_faust_or_aiohttp():
    code = ("import sys, pkgutil, importlib, app.pipeline as p\n"
            "for m in pkgutil.iter_modules(p.__path__): importlib.import_module(f'app.pipeline.{m.name}')\n"
            "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('faust', 'aiohttp', 'mode', 'aiokafka'))\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"app.pipeline imports {out.stdout.strip()}"
