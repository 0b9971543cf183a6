# The worker of bench/launcher/preload_exit/run.sh: usage script.py DIR
import json, csv, argparse, email.message, http.client, xml.dom.minidom, decimal, fractions, statistics, sqlite3
import os, sys, time
import torch
x = torch.randn(1000, 1000)
LOG = open(os.path.join(sys.argv[1], "log_%s" % os.environ["RANK"]), "w")
LOG.write("x" * 1000)
with open(os.path.join(sys.argv[1], "t_%s" % os.environ["RANK"]), "w") as f:
    f.write(repr(time.time()))
