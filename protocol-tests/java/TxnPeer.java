// A transactional Java producer the tests steer line by line, so they can hold a transaction open,
// look at the broker, and then end it. Run without a build:
//   java -cp "<kafka libs>/*" protocol-tests/java/TxnPeer.java BOOTSTRAP TRANSACTIONAL_ID TOPIC PARTITION
// stdin commands (one per line), each answered on stdout once done:
//   begin N              start a transaction and write N records (keys k<offset-ish>, values v...) -> OPEN
//   offsets GROUP OFFSET add a commit of OFFSET for GROUP on TOPIC/PARTITION to the transaction    -> OFFSETS
//   commit | abort       end the transaction                                                      -> COMMITTED | ABORTED
//   quit                 close the producer and exit                                               -> BYE
// Any failure prints "ERROR <message>" and exits 1. The transaction timeout is long (10 minutes) so a
// transaction left open stays open for the whole test, as a slow but healthy producer's would.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringSerializer;

@SuppressWarnings("removal") // ConsumerGroupMetadata(String): the simplest group for a transactional offset commit
public class TxnPeer {
    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.out.println("ERROR usage: BOOTSTRAP TRANSACTIONAL_ID TOPIC PARTITION");
            System.exit(1);
        }
        String topic = args[2];
        int partition = Integer.parseInt(args[3]);
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, args[1]);
        props.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "600000");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        int written = 0;
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            producer.initTransactions();
            System.out.println("READY");
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
            String line;
            while ((line = in.readLine()) != null) {
                String[] cmd = line.trim().split("\\s+");
                switch (cmd[0]) {
                    case "begin":
                        producer.beginTransaction();
                        int n = Integer.parseInt(cmd[1]);
                        for (int i = 0; i < n; i++, written++) {
                            producer.send(new ProducerRecord<>(topic, partition, "k" + written, "v" + written));
                        }
                        producer.flush();
                        System.out.println("OPEN");
                        break;
                    case "offsets":
                        producer.sendOffsetsToTransaction(
                            Map.of(new TopicPartition(topic, partition), new OffsetAndMetadata(Long.parseLong(cmd[2]))),
                            new ConsumerGroupMetadata(cmd[1]));
                        System.out.println("OFFSETS");
                        break;
                    case "commit":
                        producer.commitTransaction();
                        System.out.println("COMMITTED");
                        break;
                    case "abort":
                        producer.abortTransaction();
                        System.out.println("ABORTED");
                        break;
                    case "quit":
                        System.out.println("BYE");
                        return;
                    default:
                        System.out.println("ERROR unknown command " + line);
                        System.exit(1);
                }
            }
        } catch (Exception e) {
            System.out.println("ERROR " + e);
            System.exit(1);
        }
    }
}
