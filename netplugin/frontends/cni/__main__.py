from netplugin.frontends.cni.shim import main

main()
