from netplugin.frontends.cni.fast import main

main()
