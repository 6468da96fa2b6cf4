import sys

from netplugin.frontends.cni.native import main

sys.exit(main())
