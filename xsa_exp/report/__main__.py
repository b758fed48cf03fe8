from xsa_exp.report.cli import main

main()
